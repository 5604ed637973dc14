#!/bin/sh
# test_show.sh: `cuinterpose show` decodes a checkpoint's images and
# verifies every carrier chunk: a good checkpoint passes (exit 0), and a
# flipped byte, a cut carrier or one that is no file (a directory, a FIFO),
# a missing topology image or a damaged
# inventory are each named (file, allocation, chunk) with exit 1, and so
# are a compressed chunk's damaged frame and stored lengths the index cannot
# have (a compressed chunk that is whole passes); a
# directory without cuinterpose images exits 3, usage errors 2. Images are
# written by mkimages (the plugin's own writer), so no CRIU is needed.
set -u
cli=$CUIP_CLI
T=$(mktemp -d "${TMPDIR:-/tmp}/cuip-show.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; [ -f "$T/out" ] && cat "$T/out"; exit 1; }
show() { "$cli" show "$@" >"$T/out" 2>&1; echo $?; }
fresh() { rm -rf "$T/d" && mkdir "$T/d" && ./mkimages "$T/d" || fail "mkimages"; }
CARRIER=cuinterpose-carrier-100.img

fresh
[ "$(show "$T/d")" = 0 ] || fail "a good checkpoint is refused"
grep -q "2 participants, 16484 carried bytes" "$T/out" || fail "inventory line"
grep -q "== cuinterpose-100.img: participant pid 100, 16484 carried bytes" "$T/out" || fail "topology of pid 100"
grep -q "== cuinterpose-200.img: participant pid 200, 0 carried bytes" "$T/out" || fail "topology of pid 200"
grep -q "1111111111111111:1  $CARRIER  offset 0  size 12288  chunks 3 x 4096  checksums 3  OK" "$T/out" ||
	fail "carrier entry of allocation 1"
grep -q "1111111111111111:2  $CARRIER  offset 12288  size 4196  chunks 2 x 4096  checksums 2  OK" "$T/out" ||
	fail "carrier entry of allocation 2 (short last chunk)"
grep -q "origin vmm-import  creator pid 100" "$T/out" || fail "importer records"
grep -q "^OK: .* 16484 carrier bytes in 5 chunks match" "$T/out" || fail "summary"

[ "$(show "$T/d" --json)" = 0 ] || fail "--json of a good checkpoint"
for f in '"ok":true' '"carried_bytes":16484' '"chunks_checked":5' '"chunk_size":4096,"chunks":3' \
	'"status":"OK","corrupt_chunks":\[\]' '"image":"cuinterpose-200.img"' '"problems":\[\]'; do
	grep -q "$f" "$T/out" || fail "json lacks $f"
done

# One flipped byte in allocation 2, chunk 1 (file offset 12288 + 4096 + 5).
printf 'Z' | dd of="$T/d/$CARRIER" bs=1 seek=16389 conv=notrunc 2>/dev/null
[ "$(show "$T/d")" = 1 ] || fail "a corrupt carrier exits 0"
grep -q "$CARRIER: corrupt: allocation 1111111111111111:2 chunk 1 (bytes 16384..16484)" "$T/out" ||
	fail "the corrupt chunk is not named"
grep -q "1111111111111111:1 .* OK$" "$T/out" || fail "the intact allocation is not OK"
grep -q "1111111111111111:2 .* CORRUPT$" "$T/out" || fail "the damaged allocation is not CORRUPT"
grep -q "^FAIL: 1 problem" "$T/out" || fail "summary of a corrupt carrier"
[ "$(show "$T/d" --json)" = 1 ] || fail "--json of a corrupt carrier exits 0"
grep -q '"status":"CORRUPT","corrupt_chunks":\[1\]' "$T/out" || fail "json: corrupt chunk"
grep -q '"ok":false' "$T/out" || fail "json: ok"
[ "$(show "$T/d" --no-verify)" = 0 ] || fail "--no-verify reads the carrier"

# A cut carrier: the plugin's validation refuses it too.
fresh
truncate -s 8192 "$T/d/$CARRIER"
[ "$(show "$T/d")" = 1 ] || fail "a truncated carrier exits 0"
grep -q "$CARRIER: truncated: allocation 1111111111111111:1 chunk 2" "$T/out" || fail "truncation not named"
grep -q "restore would refuse: $CARRIER: truncated: 8192 bytes, the index needs 12288" "$T/out" ||
	fail "the plugin's own check is not reported"

# A carrier that cannot be read at all (a directory in its place): the
# read's error is named, not taken for a cut file.
fresh
rm "$T/d/$CARRIER" && mkdir "$T/d/$CARRIER"
[ "$(show "$T/d")" = 1 ] || fail "an unreadable carrier exits 0"
grep -q "$CARRIER: allocation 1111111111111111:1 chunk 0 cannot be read: Is a directory" "$T/out" ||
	fail "the read error is not named"
grep -q "1111111111111111:1 .* UNREADABLE$" "$T/out" || fail "the unreadable allocation is not UNREADABLE"
grep -q "restore would refuse: $CARRIER: not a regular file (allocation 1111111111111111:1 chunk 0)" "$T/out" ||
	fail "the plugin's own check does not name a carrier that is no file"
grep -q "truncated" "$T/out" && fail "an unreadable carrier is called truncated"
# A FIFO in its place: named at once, not waited on for a writer.
fresh
rm "$T/d/$CARRIER" && mkfifo "$T/d/$CARRIER"
rc=$(timeout 60 "$cli" show "$T/d" >"$T/out" 2>&1; echo $?)
[ "$rc" = 124 ] && fail "show waited on a FIFO in the carrier's place"
[ "$rc" = 1 ] || fail "a FIFO in the carrier's place exits $rc"
grep -q "$CARRIER: allocation 1111111111111111:1 chunk 0 cannot be read: Illegal seek" "$T/out" ||
	fail "the FIFO's read error is not named"
grep -q "restore would refuse: $CARRIER: not a regular file" "$T/out" || fail "the plugin's check passes a FIFO"

# A missing topology image.
fresh
rm "$T/d/cuinterpose-200.img"
[ "$(show "$T/d")" = 1 ] || fail "a missing topology image exits 0"
grep -q "cuinterpose-200.img" "$T/out" || fail "the missing image is not named"

# A damaged inventory: topology images are still decoded.
fresh
printf 'XXXX' | dd of="$T/d/cuinterpose-inventory.img" bs=1 seek=20 conv=notrunc 2>/dev/null
[ "$(show "$T/d")" = 1 ] || fail "a damaged inventory exits 0"
grep -q "cuinterpose-inventory.img" "$T/out" || fail "the damaged inventory is not named"
grep -q "== cuinterpose-100.img" "$T/out" || fail "topologies not decoded without an inventory"

# Compressed chunks: chunk 0 of allocation 1 is a zstd frame.
zfresh() { rm -rf "$T/d" && mkdir "$T/d" && ./mkimages "$T/d" "$1" || fail "mkimages $1"; }
zfresh zstd
[ "$(show "$T/d")" = 0 ] || fail "a checkpoint with a compressed chunk is refused"
grep -q "1111111111111111:1  $CARRIER  offset 0  size 12288  chunks 3 x 4096  checksums 3  OK" "$T/out" ||
	fail "the compressed entry is not verified OK"
grep -q "    1 of 3 chunks stored compressed (zstd): 4096 bytes in [0-9]*" "$T/out" || fail "the compressed chunk is not listed"
[ "$(show "$T/d" --json)" = 0 ] || fail "--json of a compressed chunk"
grep -q '"compressed_chunks":1,"compressed_bytes":4096,"compressed_stored":[1-9]' "$T/out" || fail "json: compressed chunk"
# Its frame's magic number damaged.
printf 'Z' | dd of="$T/d/$CARRIER" bs=1 seek=1 conv=notrunc 2>/dev/null
[ "$(show "$T/d")" = 1 ] || fail "a damaged frame exits 0"
grep -q "$CARRIER: corrupt: allocation 1111111111111111:1 chunk 0 (bytes 0\.\.[0-9]*): its zstd frame does not decompress to the chunk's 4096 bytes" "$T/out" ||
	fail "the damaged frame is not named"
grep -q "1111111111111111:2 .* OK$" "$T/out" || fail "the intact allocation is not OK beside a damaged frame"
# An index whose stored lengths cannot be: the plugin's checks refuse it too.
zfresh zstd-count
[ "$(show "$T/d")" = 1 ] || fail "2 stored lengths for 3 chunks exit 0"
grep -q "carrier entry 0 has 2 stored lengths for 3 chunks" "$T/out" || fail "the stored count is not named"
grep -q "restore would refuse: cuinterpose-100.img: carrier entry 0 has 2 stored lengths for 3 chunks" "$T/out" ||
	fail "the plugin's own check of the stored count is not reported"
zfresh zstd-len
[ "$(show "$T/d")" = 1 ] || fail "a chunk stored in all its bytes exits 0"
grep -q "carrier entry 0 stores chunk 1 in 4096 bytes, which is not less than its 4096" "$T/out" ||
	fail "the impossible stored length is not named"
grep -q "1111111111111111:1 .* UNREADABLE$" "$T/out" || fail "the entry with an impossible length is not UNREADABLE"

mkdir "$T/empty"
[ "$(show "$T/empty")" = 3 ] || fail "a directory without images"
grep -q "holds no cuinterpose images" "$T/out" || fail "message for a foreign directory"
[ "$(show "$T/nonexistent")" = 2 ] || fail "a missing directory"
[ "$(show)" = 2 ] || fail "no argument"
[ "$(show "$T/d" --bogus)" = 2 ] || fail "unknown option"
echo PASS
