# A job's release hooks (cuinterpose_on_checkpoint) give back what it only
# caches before the checkpoint, and the checkpoint carries only what stays
# allocated. Each of the 2 ranks holds a never-written E2E_RESERVED_MB
# reservation that its hook frees (E2E_RELEASE=free, as torch's
# empty_cache gives back a caching allocator's free blocks): over two
# cycles no carrier file holds it, each rank's log counts the freed bytes
# exactly, and after each restore the job allocates the reservation again
# and every other byte and address is back. Registration refuses NULL
# (-EINVAL) and a 17th hook (-ENOSPC) (checked by the job at start).
# A hook that overruns CUINTERPOSE_TEST_RELEASE_TIMEOUT_MS delays nothing: the
# dump goes on, carrying the memory it did not free; a dump while it still
# runs neither waits for it nor runs it again, and the job restores with it
# running.
# CUINTERPOSE_RELEASE=torch in a process without Python is reported, and the
# dump goes on; bad values of the two variables (and of CUINTERPOSE_LOG)
# make the job's first cuInit fail, each named with what it accepts.
. "$srcdir/lib.sh"

RESV=48
CAP=$((RESV << 20))
# carrier_sizes DIR: the apparent size of each carrier file, one per line
carrier_sizes() {
	local f
	for f in "$1"/cuinterpose-carrier-*.img; do [ -f "$f" ] && stat -c %s "$f"; done
	return 0
}

note "1: bad values"
job_refused CUINTERPOSE_RELEASE=tensorflow CUINTERPOSE_TEST_RELEASE_TIMEOUT_MS=5s CUINTERPOSE_LOG=debug
for want in 'CUINTERPOSE_RELEASE=tensorflow: want torch|cupy|python:STATEMENT|none' \
	'CUINTERPOSE_TEST_RELEASE_TIMEOUT_MS=5s: want ms, 1 .. 3600000' 'CUINTERPOSE_LOG=debug: want level, 0 .. 3'; do
	grep -qF "cuinterpose: pid " "$T/refused.log" && grep -qF "$want; cuInit fails (nothing has changed)" "$T/refused.log" ||
		fail "'$want' is not said: $(cat "$T/refused.log")"
done
note "2: a hook that overruns its time"
export E2E_RESERVED_MB=$RESV
E2E_RELEASE=slow:20000 CUINTERPOSE_TEST_RELEASE_TIMEOUT_MS=300 start_job 2 --private
cmd 2 verify 0
before=$(answers 2)
criu_dump "$T/slow" --leave-running || fail "criu dump with a slow hook"
n=$(grep -c "the release hooks did not return within 300 ms; the checkpoint carries what is allocated" "$T/job.log")
[ "$n" = 2 ] || fail "$n of 2 ranks report the overrun hook: $(grep -h 'release' "$T/job.log")"
for s in $(carrier_sizes "$T/slow"); do
	[ "$s" -ge $CAP ] || fail "a carrier file of $s bytes: the $RESV MiB the hook kept were not carried"
done
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "answers differ after the slow hook: $(answers 2) vs $before"
# The hooks still run (20 s): the next dump neither waits for them nor runs them again.
pids=$(job_pids)
criu_dump "$T/slow2" || fail "criu dump while the hooks still run"
wait_gone $pids || fail "dumped processes still alive"
n=$(grep -c "the release hooks of an earlier checkpoint have not returned yet; not run again" "$T/job.log")
[ "$n" = 2 ] || fail "$n of 2 ranks report the hooks still running: $(grep -h 'release' "$T/job.log")"
criu_restore "$T/slow2" || fail "criu restore with the hooks still running"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "answers differ after the restore: $(answers 2) vs $before"
job_exit 2 || fail "the job did not exit"

note "3: CUINTERPOSE_RELEASE=torch without Python"
unset E2E_RESERVED_MB
CUINTERPOSE_RELEASE=torch start_job 2 --private
cmd 2 verify 0
before=$(answers 2)
pids=$(job_pids)
criu_dump "$T/nopy" || fail "criu dump with CUINTERPOSE_RELEASE=torch"
wait_gone $pids || fail "dumped processes still alive"
n=$(grep -c "CUINTERPOSE_RELEASE=torch needs a Python process; this one runs no interpreter" "$T/job.log")
[ "$n" = 2 ] || fail "$n of 2 ranks report that they run no Python: $(grep -h 'RELEASE' "$T/job.log")"
criu_restore "$T/nopy" || fail "criu restore after CUINTERPOSE_RELEASE=torch"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "answers differ: $(answers 2) vs $before"
job_exit 2 || fail "the job did not exit"

# Last: under ASan a second cycle's restore is skipped (lib.sh criu_restore).
note "4: hooks that free the reservation"
export E2E_RESERVED_MB=$RESV
E2E_RELEASE=free CUINTERPOSE_LOG=2 start_job 2 --private
cmd 2 verify 0
before=$(answers 2)
for cycle in 1 2; do
	pids=$(job_pids)
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	wait_gone $pids || fail "dumped processes still alive"
	sizes=$(carrier_sizes "$T/d$cycle")
	[ "$(echo "$sizes" | wc -w)" = 2 ] || fail "cycle $cycle: carrier files of sizes '$sizes', not 2 files"
	for s in $sizes; do
		[ "$s" -lt $CAP ] || fail "cycle $cycle: a carrier file of $s bytes: the released $RESV MiB were carried"
	done
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	cmd 2 verify 0
	[ "$(answers 2)" = "$before" ] || fail "cycle $cycle: answers differ: $(answers 2) vs $before"
done
freed=$(grep -o "release hooks: [0-9]* of [0-9]* carried bytes freed" "$T/job.log" | awk '$3 == '$CAP' {n++} END {print n + 0}')
[ "$freed" = 4 ] ||
	fail "$freed of 4 QUIESCE lines count $CAP bytes freed: $(grep -h 'release hooks' "$T/job.log")"
job_exit 2 || fail "the job did not exit"

note done
