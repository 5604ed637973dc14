# Fault-injection matrix: a failure in each dump and restore phase ends in
# exactly one of two states.
#  - dump: the job keeps running with everything intact (bytes, addresses,
#    sharing; no FD or mapping leaked by any participant) and a later
#    checkpoint works;
#  - restore: the restored processes are gone and restore.log says why.
# Faults reach a running or restored participant (or criu itself, through
# dir/any) via the fake driver's FAKECUDA_FAIL_DIR; one job is shared by
# every dump injection it survives.
. "$srcdir/lib.sh"

export FAKECUDA_FAIL_DIR=$T/faults
export CUINTERPOSE_TEST_QUIESCE_RETRIES=0
# One malloc arena: a thread's first malloc would otherwise map a new 64 MiB
# arena that is never unmapped, which is not a leak.
export MALLOC_ARENA_MAX=1
mkdir -p "$FAKECUDA_FAIL_DIR"
N=4
K=0


# FDs, mappings (lib.sh census) and device memory are counted.
export CENSUS_DEVMEM=1

# dump_fails WHAT [criu dump args]: the dump must fail.
dump_fails() {
	what=$1
	shift
	K=$((K + 1))
	note "dump fault $K: $what"
	if criu_dump "$T/f$K" "$@" >"$T/f$K.out" 2>&1; then
		fail "$what: criu dump succeeded"
	fi
	disarm
	grep -h "cuinterpose" "$T/f$K/dump.log" | grep -m1 "failed\|refused\|timed out\|rollback" ||
		fail "$what: no cuinterpose error in dump.log"
}


expect_rollback() {
	dump_fails "$@"
	intact "$1"
}

start_reference 1

# HANDSHAKE: rank 2's control socket is gone.
s2=$(ls "$CUINTERPOSE_SOCKET_DIR"/"$(pid_of 2)"-*.sock)
mv "$s2" "$s2.away"
expect_rollback "control socket closed"
mv "$s2.away" "$s2"

# HANDSHAKE timeout: rank 1 does not answer (stopped).
kill -STOP "$(pid_of 1)"
CUINTERPOSE_TEST_OP_TIMEOUT_MS=1000 CUINTERPOSE_DRIVER_TIMEOUT_MS=1000 dump_fails "participant not answering"
kill -CONT "$(pid_of 1)"
intact "participant not answering"

# QUIESCE: device work outlives the timeout, no retries. The kernel runs
# until the test releases it (busy R 0: until $T/w/busy.release exists).
rm -f "$T/w/busy.release"
cmd $N busy 1 0
CUINTERPOSE_QUIESCE_TIMEOUT_MS=300 dump_fails "device work that cannot drain"
grep -q "device work still running" "$T/f$K/dump.log" || fail "no drain timeout in dump.log"
touch "$T/w/busy.release"
intact "device work that cannot drain"

# SAVE: the creator's device-to-host copy fails.
arm "$(pid_of 0)" cuMemcpyDtoHAsync:2
expect_rollback "cuMemcpyDtoHAsync in SAVE"
grep -q "SAVE failed" "$T/f$K/dump.log" || fail "SAVE did not fail"

# SAVE: the image directory is full.
mkdir -p "$T/small"
mount -t tmpfs -o size=2m tmpfs "$T/small" || fail "cannot mount a tmpfs"
at_exit 'umount "$T/small" 2>/dev/null'
K=$((K + 1))
note "dump fault $K: image directory full"
if bounded "$FAKERUN" $SAN_CRIU "$CRIU" dump -t "$JOBPID" -D "$T/small" -L "$T/plugins" --shell-job -v4 \
	-o dump.log >/dev/null 2>&1; then
	fail "dump into a full directory succeeded"
fi
grep -m1 "No space left" "$T/small/dump.log" || fail "full disk: no ENOSPC in dump.log"
intact "image directory full"
umount "$T/small"

# PREPARE_UNICAST: an importer's unmap fails halfway. Its SAVE unmapped
# the temporary mappings of its two carried private allocations first
# (cuMemAlloc and never-shared VMM): the 4th unmap is PREPARE_UNICAST's 2nd.
arm "$(pid_of 2)" cuMemUnmap:4
expect_rollback "cuMemUnmap in PREPARE_UNICAST"
grep -q "PREPARE_UNICAST failed" "$T/f$K/dump.log" || fail "PREPARE_UNICAST did not fail"

# Native lock and native checkpoint, in criu itself.
arm any cuCheckpointProcessLock:3
expect_rollback "cuCheckpointProcessLock"
arm any cuCheckpointProcessCheckpoint:2
expect_rollback "cuCheckpointProcessCheckpoint"

# QUIESCE retried: the work drains on a later attempt and the dump works.
# The kernel is released once the first attempt has timed out (events, not
# times: a loaded machine reaches QUIESCE whenever it does).
rm -f "$T/w/busy.release"
cmd $N busy 3 0
note "dump with QUIESCE retries"
(CUINTERPOSE_QUIESCE_TIMEOUT_MS=300 CUINTERPOSE_TEST_QUIESCE_RETRIES=100 criu_dump "$T/retry" --leave-running) &
dumper=$!
for _ in $(seq 1200); do
	grep -q "QUIESCE attempt 1 of 101 timed out" "$T/retry/dump.log" 2>/dev/null && break
	kill -0 $dumper 2>/dev/null || break
	nap 0.05
done
grep -q "QUIESCE attempt 1 of 101 timed out" "$T/retry/dump.log" ||
	fail "no QUIESCE retry in dump.log within 60 s: $(grep QUIESCE "$T/retry/dump.log" 2>/dev/null | head -n 2)"
touch "$T/w/busy.release"
wait $dumper || fail "dump with QUIESCE retries"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "retry: addresses changed"

# A real checkpoint after all that; then every restore phase fails once.
GEN=1
cmd $N write 3 $GEN
cmd $N verify $GEN
pids=$(job_pids)
p0=$(pid_of 0)
p2=$(pid_of 2)
note "dump"
criu_dump "$T/d" || fail "criu dump after the injections"
wait_gone $pids || fail "dumped processes still alive"
# CRIU checks the size of the job's stdout; a failed restore appends to it.
logsize=$(stat -c %s "$T/job.log")

expect_killed() { # WHAT PID|any SPEC PHASE
	K=$((K + 1))
	note "restore fault $K: $1"
	arm "$2" "$3"
	wait_pids_free
	if bounded "$FAKERUN" $SAN_CRIU "$CRIU" restore -D "$T/d" -L "$T/plugins" --shell-job --restore-detached -v4 \
		-o "restore-$K.log" >/dev/null 2>&1; then
		: # CRIU ignores RESUME_DEVICES_LATE's status; what counts is below
	fi
	disarm
	wait_gone $pids || fail "$1: restored processes still alive"
	truncate -s "$logsize" "$T/job.log"
	log=$T/d/restore-$K.log
	grep -q "$4" "$log" || fail "$1: '$4' not in restore.log"
	grep -q "killing the restored tree\|restore cannot complete\|native restore" "$log" ||
		fail "$1: no clear error in restore.log"
	grep -h "restore cannot complete" "$log" | head -1
}

expect_killed "native restore" any cuCheckpointProcessRestore:2 "cuCheckpointProcessRestore\|native restore"
expect_killed "cuMemCreate in LOAD" "$p0" cuMemCreate:1 "LOAD failed"
expect_killed "cuMemMap in LOAD or REBUILD" "$p0" cuMemMap:1 "failed on pid"
expect_killed "import in an importer" "$p2" cuMemImportFromShareableHandle:1 "REBUILD_IMPORTERS failed"

note "restore"
criu_restore "$T/d" || fail "criu restore after the injected failures"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore"
cmd $N exit
note done
