#!/bin/bash
# scale-bench.sh - issue 11: cuinterpose's bookkeeping at 8 processes x N
# tracked allocations, on the fake driver. Run by `make -C test/e2e
# bench-scale [BENCH_ARGS="..."]` (under e2e_reaper, a child subreaper).
#
#   scale-bench.sh [-p NPROC] [-s SHARE_EVERY] [-g GRANULE_KB] [-d US_PER_MB] [-c] [N ...]
#
# For each N (default 1000 2500 5000 10000): NPROC workers (default 8) each
# create N allocations, every SHARE_EVERY-th (default 8) shared and imported
# by every other worker; the plugin's coordinator then runs the dump phases,
# rounds of native lock/checkpoint/restore/unlock (each process alone, then
# all in parallel, with the fake's checkpoint taking US_PER_MB per MiB,
# default 2000 = 0.5 GB/s; SCALE_NATIVE_ROUNDS, default 3) and the rebuild;
# the workers check every tag. -c adds a full `criu dump` + `criu restore`
# of the job with the plugin. GRANULE_KB (default 4) is the fake's VMM
# granularity: allocations are one granule, so carrier and native byte
# copies stay negligible.
# Why every 8th: devd keeps one socket per live export (that is how it sees
# the last close of an export FD) and this machine's hard RLIMIT_NOFILE is
# 20,000 (no CAP_SYS_RESOURCE): 8 x 10,000 / 4 exports would not fit.
set -u
: "${top_builddir:?run through make -C test/e2e bench-scale}"
B=$(cd "$top_builddir" && pwd)
BIN=$B/test/e2e/scale-bench
FAKERUN=$B/test/fakecuda/fakecuda-run
BOUNDED=$(cd "$(dirname "$0")/../.." && pwd)/contrib/bounded # criu must not wait forever
# The preload list: the ASan runtime first in sanitizer builds (test/e2e sets CUIP_ASAN_RT).
INTERPOSER=${CUIP_ASAN_RT:+$CUIP_ASAN_RT:}$B/interposer/.libs/libcuinterpose.so
PLUGIN=$B/plugin/.libs/cuinterpose_plugin.so
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
NPROC=8 EVERY=8 GRAN=4 DELAY=2000 CRIU_RUN=0
while getopts p:s:g:d:c o; do
	case $o in
	p) NPROC=$OPTARG ;;
	s) EVERY=$OPTARG ;;
	g) GRAN=$OPTARG ;;
	d) DELAY=$OPTARG ;;
	c) CRIU_RUN=1 ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
SIZES=${*:-1000 2500 5000 10000}
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)"

T=$(mktemp -d /tmp/cuip-scale.XXXXXX)
export FAKECUDA_SOCKET=$T/devd.sock
export CUINTERPOSE_SOCKET_DIR=$T/sock
export FAKECUDA_MEM_MB=$((1 << 20))
export FAKECUDA_VMM_GRANULARITY_KB=$GRAN
export FAKECUDA_CKPT_US_PER_MB=$DELAY
export CUINTERPOSE_LOCK_TIMEOUT_MS=60000
JOB=
cleanup() {
	[ -n "$JOB" ] && kill -9 -- -"$JOB" 2>/dev/null
	"$FAKERUN" --stop >/dev/null 2>&1
	rm -rf "$T"
}
trap cleanup EXIT

echo "scale-bench: $(uname -n), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo "  $NPROC processes, every ${EVERY}th allocation shared with the other $((NPROC - 1)), granule ${GRAN} KiB"
RESULTS=()
for N in $SIZES; do
	rm -rf "$T/w" "$T/sock" "$T/img" "$T/criu"
	mkdir -p "$T/w" "$T/sock" "$T/img"
	"$FAKERUN" --stop >/dev/null 2>&1
	t0=$(date +%s.%N)
	# One tree (criu dumps it from its root), its own process group.
	setsid bash -c 'for r in $(seq 0 $(($2 - 1))); do
			env LD_PRELOAD="$3" "$4" "$5" worker "$1" $r $2 $6 $7 &
		done; wait' _ "$T/w" "$NPROC" "$INTERPOSER" "$FAKERUN" "$BIN" "$N" "$EVERY" \
		</dev/null >"$T/job.log" 2>&1 &
	JOB=$!
	while [ "$(ls "$T"/w/r*.ready 2>/dev/null | wc -l)" -lt "$NPROC" ]; do
		if ! kill -0 "$JOB" 2>/dev/null; then cat "$T/job.log"; exit 1; fi
		sleep 0.1
	done
	setup=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.1f", $1 - $2}')
	echo "== N=$N allocations per process ($((N * NPROC)) in the driver, setup ${setup} s)"
	"$FAKERUN" "$BIN" coord "$T/w" "$NPROC" "$T/sock" "$T/img" native | tee "$T/coord.out" || exit 1
	pids=$(cat "$T"/w/r*.ready)
	kill -USR1 $pids
	for r in $(seq 0 $((NPROC - 1))); do
		while [ ! -f "$T/w/r$r.v1" ]; do sleep 0.05; done
		grep -q '^ok' "$T/w/r$r.v1" || { echo "rank $r: $(cat "$T/w/r$r.v1")"; exit 1; }
	done
	echo "  every tag checked in every process: ok"
	line=$(grep '^SUMMARY' "$T/coord.out")
	if [ "$CRIU_RUN" = 1 ]; then
		mkdir -p "$T/criu/plugins" "$T/criu/img"
		ln -s "$PLUGIN" "$T/criu/plugins/"
		t0=$(date +%s.%N)
		"$BOUNDED" 600 "$FAKERUN" "$CRIU" dump -t "$JOB" -D "$T/criu/img" -L "$T/criu/plugins" --shell-job -v4 \
			-o dump.log || { grep -E "Error|cuinterpose" "$T/criu/img/dump.log" | tail; exit 1; }
		t1=$(date +%s.%N)
		"$BOUNDED" 600 "$FAKERUN" "$CRIU" restore -D "$T/criu/img" -L "$T/criu/plugins" --shell-job --restore-detached \
			-v4 -o restore.log || { grep -E "Error|cuinterpose" "$T/criu/img/restore.log" | tail; exit 1; }
		t2=$(date +%s.%N)
		kill -USR1 $pids
		for r in $(seq 0 $((NPROC - 1))); do
			i=0
			while [ ! -f "$T/w/r$r.v2" ]; do
				sleep 0.05
				i=$((i + 1))
				[ $i -gt 1200 ] && { echo "rank $r did not answer after restore"; exit 1; }
			done
			grep -q '^ok' "$T/w/r$r.v2" || { echo "rank $r after restore: $(cat "$T/w/r$r.v2")"; exit 1; }
		done
		cd_=$(echo "$t1 $t0" | awk '{printf "%.3f", $1 - $2}')
		cr_=$(echo "$t2 $t1" | awk '{printf "%.3f", $1 - $2}')
		echo "  criu dump ${cd_} s, criu restore ${cr_} s, every tag checked after restore: ok"
		grep -hE "cuinterpose: (INSPECT|PREFLIGHT|QUIESCE|SAVE|PREPARE_UNICAST|NATIVE)" "$T/criu/img/dump.log" |
			sed 's/^.*cuinterpose: /    dump.log: /'
		grep -hE "cuinterpose: (NATIVE|LOAD|REBUILD|VERIFY)" "$T/criu/img/restore.log" |
			sed 's/^.*cuinterpose: /    restore.log: /'
		line="$line criu_dump=$cd_ criu_restore=$cr_"
	fi
	RESULTS+=("N=$N $line")
	kill -9 -- -"$JOB" 2>/dev/null
	wait "$JOB" 2>/dev/null
	JOB=
done
echo "== summary (seconds; total = inspect + prepare + restore bookkeeping, target <= 1 s at 8 x 10000)"
printf '%s\n' "${RESULTS[@]}" | awk '
{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  n = v["N"]; t = v["total"]
  if (NR == 1) { n0 = n; t0 = t }
  printf "N=%-6s inspect %.3f  prepare %.3f (SAVE %.3f)  restore %.3f (LOAD %.3f)  total %.3f  per 1k allocs %.3f  x%.1f vs N=%s", \
	n, v["inspect"], v["prepare"], v["save"], v["restore"], v["load"], t, t / n * 1000, t / t0, n0
  if (v["native_max_single"] > 0) printf "  native group %.3f / slowest %.3f = %.2f", v["native_par"], v["native_max_single"], v["native_par"] / v["native_max_single"]
  if (v["criu_dump"] != "") printf "  criu dump %s restore %s", v["criu_dump"], v["criu_restore"]
  printf "\n"
  last_n = n; last_t = t; last_np = v["native_par"]; last_ns = v["native_max_single"] }
END {
  if (NR == 0) exit
  printf "== verdicts (largest N = %s per process, %d processes)\n", last_n, '"$NPROC"'
  printf "bookkeeping  %.3f s for %d allocations per process: %s (target <= 1 s at 8 x 10000)\n", \
	last_t, last_n, (last_n >= 10000 && '"$NPROC"' >= 8) ? (last_t <= 1 ? "MET" : "MISSED") : "n/a (smaller than the target)"
  if (NR > 1) printf "growth       per-1k cost at N=%s / at N=%s = %.2f (1 = linear): %s (<= 1.3)\n", \
	last_n, n0, (last_t / last_n) / (t0 / n0), ((last_t / last_n) / (t0 / n0) <= 1.3) ? "MET" : "MISSED"
  if (last_ns > 0) printf "native       all at once / slowest alone = %.2f: %s (target <= 1.2)\n", \
	last_np / last_ns, (last_np / last_ns <= 1.2) ? "MET" : "MISSED"
}'
