#!/usr/bin/env bash
# query-bench.sh BUILDDIR GPUBIN LIB_BEFORE LIB_AFTER [ROUNDS]: the interposition
# cost of two interposers in one run on the fake driver (docs/benchmarks.md,
# issue 17), under one private fakecuda-devd:
#  - gate-bench (BUILDDIR/test/e2e/gate-bench, `make -C test/e2e gate-bench`)
#    with -i LIB_BEFORE -i LIB_AFTER: plain, before and after in each of 7
#    rounds, the order rotating;
#  - ROUNDS (default 7) rounds of gpu_microbench (GPUBIN from test/gpu/build.sh
#    BUILDDIR GPUBIN), one process plain, one with LIB_BEFORE and one with
#    LIB_AFTER preloaded per round, the order rotating.
# Every benchmark process is pinned to the CPUs QB_CPUS (default 1; "none":
# unpinned). Prints the raw lines, then per loop and mode the median of the
# rounds' medians, the min of the mins and the paired ratio (median over the
# rounds of mode / plain of the same round).
set -euo pipefail
b=$(cd "${1:?usage: query-bench.sh BUILDDIR GPUBIN LIB_BEFORE LIB_AFTER [ROUNDS]}" && pwd)
bin=${2:?}
before=${3:?}
after=${4:?}
rounds=${5:-7}
cpus=${QB_CPUS:-1}
pin=()
if [ "$cpus" != none ]; then
	if command -v taskset >/dev/null && taskset -c "$cpus" true 2>/dev/null; then
		pin=(taskset -c "$cpus")
	else
		echo "query-bench: cannot pin to CPUs $cpus: unpinned"
		cpus=none
	fi
fi
run=$b/test/fakecuda/fakecuda-run
tmp=$(mktemp -d /tmp/cuip-qbench.XXXXXX)
export FAKECUDA_SOCKET=$tmp/devd.sock CUINTERPOSE_SOCKET_DIR=$tmp/sock
trap '"$run" --stop; rm -rf "$tmp"' EXIT
echo "== $(date -u '+%F %T') UTC, $(nproc) CPUs, pinned to $cpus, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== gate-bench"
"$run" "${pin[@]}" "$b/test/e2e/gate-bench" -i "$before" -i "$after" -n 50000 -r 7
modes=(plain before after)
for ((i = 1; i <= rounds; i++)); do
	for k in 0 1 2; do
		m=${modes[$(((i + k) % 3))]}
		case $m in
		plain) "$run" "${pin[@]}" "$bin/gpu_microbench" 200000 5 ;;
		before) "$run" env LD_PRELOAD="$before" "${pin[@]}" "$bin/gpu_microbench" 200000 5 ;;
		after) "$run" env LD_PRELOAD="$after" "${pin[@]}" "$bin/gpu_microbench" 200000 5 ;;
		esac | sed "s/^/$m $i /" >>"$tmp/micro.log"
	done
done
echo "== gpu_microbench raw: MODE ROUND LOOP MEDIAN MIN MAX"
cat "$tmp/micro.log"
echo "== gpu_microbench, $rounds rounds: median of the rounds' medians (min of the mins), ns; paired ratio to plain"
awk '
function med(v, k,   i, j, t) {
	for (i = 2; i <= k; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
	return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
}
NF == 6 { md[$1, $3, $2] = $4; mn[$1, $3, $2] = $5; R[$2] = 1; L[$3] = 1 }
END {
	printf "%-12s %18s %18s %8s %18s %8s\n", "loop", "plain", "before", "ratio", "after", "ratio"
	split("props copy+launch launch", ops, " ")
	for (o = 1; o <= 3; o++) {
		op = ops[o]; if (!(op in L)) continue
		line = sprintf("%-12s", op)
		split("plain before after", ms, " ")
		for (x = 1; x <= 3; x++) {
			m = ms[x]; k = 0; lo = 1e300
			for (r in R) if ((m, op, r) in md && ("plain", op, r) in md) {
				k++; v[k] = md[m, op, r]; q[k] = md[m, op, r] / md["plain", op, r]
				if (mn[m, op, r] < lo) lo = mn[m, op, r]
			}
			if (!k) continue
			line = line sprintf(" %9.1f (%6.1f)", med(v, k), lo)
			if (m != "plain") line = line sprintf(" %8.3f", med(q, k))
		}
		print line
	}
}' "$tmp/micro.log"
