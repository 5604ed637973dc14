#!/usr/bin/env bash
# compress.sh - would compressing carrier chunks pay on this machine (issue
# 30)? Writes what the suite's jobs carry to files and runs compress-bench
# (test/bench/compress-bench.c: zstd -1, zstd -3 and LZ4 over 1 MiB chunks
# on THREADS threads against memcpy, every byte checked), then measures the
# disk the images would go to: a plain write until durable and a plain
# cold read of the same bytes, the ceiling compression would have to beat.
#
#   bundle/scripts/compress.sh DIR [THREADS]
#
# The bytes: the LLM job's model (fwjob.py llm: GPT-2 shape, seeded, fp16),
# the same weights in fp32 (a training job's master copy), and the fp16
# key/value cache of a 1,024-token generation. Random-initialised weights,
# as every job here has (no trained checkpoint on the machine).
set -u
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(cd "$here/.." && pwd)
DIR=${1:?usage: compress.sh DIR [THREADS]}
THREADS=${2:-16}
mkdir -p "$DIR" || exit 1
rc=0

timeout 300 python3 - "$DIR" <<'EOF' || { echo "compress.sh: writing the job's bytes failed or took over 300 s"; exit 1; }
import sys, torch, transformers
d = sys.argv[1]
torch.manual_seed(1234)
cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
m = transformers.GPT2LMHeadModel(cfg).eval()
def save(name, tensors):
    with open("%s/%s" % (d, name), "wb") as f:
        for t in tensors:
            f.write(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
save("weights-fp32.bin", m.parameters())
m = m.half().cuda()
save("weights-fp16.bin", m.parameters())
g = torch.Generator(device="cuda").manual_seed(1234)
ids = torch.randint(0, 50257, (1, 1024), device="cuda", generator=g)
with torch.no_grad():
    out = m(ids, use_cache=True)
kv = out.past_key_values
layers = kv.to_legacy_cache() if hasattr(kv, "to_legacy_cache") else kv
save("kv-fp16.bin", [t for layer in layers
                     for t in (layer if isinstance(layer, (tuple, list)) else (layer.keys, layer.values))
                     if t is not None])
EOF
for f in weights-fp16.bin weights-fp32.bin kv-fp16.bin; do
	# The bundle's libzstd and liblz4 for the bench only (python keeps the machine's libraries).
	LD_LIBRARY_PATH=$bundle/lib timeout 300 "$bundle/workloads/compress-bench" "$DIR/$f" "$THREADS" ||
		{ echo "compress-bench $f failed or took over 300 s (rc $?)"; rc=1; }
done
# The disk: the fp32 weights written until durable, then read cold.
src=$DIR/weights-fp32.bin
bytes=$(stat -c %s "$src")
t0=$(date +%s.%N)
timeout 120 dd if="$src" of="$DIR/copy.bin" bs=16M conv=fsync status=none || { echo "dd write failed"; rc=1; }
t1=$(date +%s.%N)
sync
how=cold
{ echo 3 >/proc/sys/vm/drop_caches; } 2>/dev/null || how="warm (the page cache could not be dropped)"
t2=$(date +%s.%N)
timeout 120 dd if="$DIR/copy.bin" of=/dev/null bs=16M status=none || { echo "dd read failed"; rc=1; }
t3=$(date +%s.%N)
[ "$rc" = 0 ] && awk -v b="$bytes" -v w0="$t0" -v w1="$t1" -v r0="$t2" -v r1="$t3" -v how="$how" \
	'BEGIN { w = w1 - w0; r = r1 - r0; printf "disk: %d bytes written until durable at %.2f GB/s, read %s at %.2f GB/s (one stream)\n", b, b / w / 1e9, how, b / r / 1e9 }'
df -h "$DIR" | tail -1 | awk '{ print "disk: " $2 " in all, " $4 " free" }'
free -g | awk '/^Mem:/ { print "host memory: " $2 " GiB, " $7 " GiB available" }'
rm -f "$DIR"/*.bin
exit $rc
