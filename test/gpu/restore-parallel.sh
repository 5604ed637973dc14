#!/usr/bin/env bash
# restore-parallel.sh BUNDLE: is NVIDIA's native restore of two processes on
# two GPUs parallel when issued from two separate processes (cuda-checkpoint
# style), as opposed to two threads of one process (the plugin's agent)?
# Two scale-bench workers (256 private allocations of 2 MiB each, no
# sharing, no interposer), one per GPU; lock + checkpoint both, then time
# the restore of both at once (two shim processes), of each alone, and the
# same for checkpoint. Prints seconds.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$(cd "${1:?usage: restore-parallel.sh BUNDLE}" && pwd)
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SHIM=$B/workloads/cuda-checkpoint-shim
T=$(mktemp -d /tmp/cuip-rp.XXXXXX)
pids=()
for g in 0 1; do
	mkdir -p "$T/w$g"
	CUDA_VISIBLE_DEVICES=$g setsid "$B/workloads/scale-bench" worker "$T/w$g" 0 1 256 1000000 </dev/null \
		>"$T/w$g.log" 2>&1 &
done
for g in 0 1; do
	for _ in $(seq 600); do [ -f "$T/w$g/r0.ready" ] && break; sleep 0.1; done
	pids+=("$(cat "$T/w$g/r0.ready")")
done
now() { date +%s.%N; }
el() { echo "$(now) $1" | awk '{printf "%.3f", $1 - $2}'; }
act() { "$SHIM" --action "$1" --pid "$2" --timeout 30000 >/dev/null || echo "FAIL $1 $2"; }
for round in 1 2 3; do
	for p in "${pids[@]}"; do act lock "$p"; done
	# wait for the two actions only (the workers are background jobs too)
	t=$(now); act checkpoint "${pids[0]}" & j1=$!; act checkpoint "${pids[1]}" & j2=$!; wait $j1 $j2; ck2=$(el "$t")
	t=$(now); act restore "${pids[0]}" & j1=$!; act restore "${pids[1]}" & j2=$!; wait $j1 $j2; rs2=$(el "$t")
	for p in "${pids[@]}"; do act unlock "$p"; done
	a=()
	for p in "${pids[@]}"; do
		act lock "$p"
		t=$(now); act checkpoint "$p"; c1=$(el "$t")
		t=$(now); act restore "$p"; r1=$(el "$t")
		act unlock "$p"
		a+=("ckpt $c1 restore $r1")
	done
	echo "round $round: both at once (two processes): checkpoint $ck2 restore $rs2; alone: ${a[0]}; ${a[1]}"
done
kill -TERM "${pids[@]}" 2>/dev/null
rm -rf "$T"
