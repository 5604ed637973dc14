# Eight processes, one per (fake) GPU, rank 0 also holding 1,000 private and
# 1,000 shared allocations of one 4 KiB granule, each shared one imported by
# the 7 others (issue 32). LOAD carries rank 0's thousands of items in runs
# of up to 512 per staging buffer (2 MiB on two cores), one asynchronous
# copy each: its I/O threads queue more copies than the fake's work ring
# holds (1,024) while CRIU keeps the fake's worker thread stopped. On the
# H200 a device makes progress whatever the process's threads do; the fake
# must too, or LOAD hangs with no participant answering (it did: the ring's
# producers waited for the stopped worker). A larger granule would not fill
# the ring. Two cycles with the default (asynchronous) LOAD copies; after
# each restore every byte of every allocation at its address, a write
# through rank 7 seen by all, a fresh export/import. Every criu call is
# bounded (lib.sh: contrib/bounded): a hang fails the test naming the call,
# its last progress line and its log.
if [ -n "${CUIP_ASAN_RT:-}" ]; then
	: "${CUIP_CRIU_LIMIT_S:=180}"
else
	: "${CUIP_CRIU_LIMIT_S:=60}"
fi
export CUIP_CRIU_LIMIT_S
. "$srcdir/lib.sh"
type bounded >/dev/null 2>&1 || fail "lib.sh does not bound criu calls (contrib/bounded)"

ulimit -n "$(ulimit -Hn)"
export FAKECUDA_DEVICES=8 E2E_SPREAD=1 E2E_SMALL=1000
export FAKECUDA_VMM_GRANULARITY_KB=4
# 16 MiB of staging on this machine's two I/O threads: 2 MiB buffers, so a
# run is 512 small items (lib.sh's 4 MiB would give 1 MiB buffers).
export CUINTERPOSE_STAGING_MB=16
unset CUINTERPOSE_TEST_LOAD_COPIES # criu's: the default, asynchronous copies
# A stalled LOAD is named by the plugin ("no progress for 20 s in LOAD")
# well before criu's own bound ends it.
export CUINTERPOSE_STALL_TIMEOUT_MS=20000

# run_criu dump|restore DIR WHAT: one bounded criu call (criu_dump or
# criu_restore); a hang (status 124) is named with the last progress line of
# its log.
run_criu() {
	local fn=$1 d=$2 what=$3 log rc

	shift 3
	log=$d/$fn.log
	"criu_$fn" "$d" "$@"
	rc=$?
	[ $rc = 0 ] && return 0
	[ $rc = 124 ] && fail "$what hung (killed after $CUIP_CRIU_LIMIT_S s): $(grep -h "in progress" "$log" | tail -1); log: $log"
	fail "$what failed ($rc); log: $log"
}

start_job 8
cmd 8 verify 0
before=$(answers 8)
[ "$(echo "$before" | grep -c " small 1000 x 4096 at ")" = 8 ] || fail "not every rank maps the small allocations: $before"
gen=0
for cycle in 1 2; do
	pids=$(job_pids)
	note "cycle $cycle: dump"
	run_criu dump "$T/d$cycle" "criu dump (cycle $cycle)"
	wait_gone $pids || fail "dumped processes still alive"
	note "cycle $cycle: restore"
	run_criu restore "$T/d$cycle" "criu restore (cycle $cycle)"
	records=$(sed -n 's/.*cuinterpose: LOAD: 8 participants, \([0-9]*\) records.*/\1/p' "$T/d$cycle/restore.log")
	[ "${records:-0}" -ge 2000 ] || fail "LOAD carried ${records:-no} records, not rank 0's 2,000 small ones and more"
	cmd 8 verify $gen
	[ "$(answers 8)" = "$before" ] || fail "addresses changed: $(answers 8) vs $before"
	gen=$((gen + 1))
	cmd 8 write 7 $gen
	cmd 8 verify $gen
	cmd 8 fresh
done
grep -h "cuinterpose: LOAD" "$T"/d*/restore.log | sed 's/^.*cuinterpose: /  /' | tail -4
cmd 8 exit
note done
