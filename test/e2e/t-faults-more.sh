# Fault-injection matrix, the cells t-faults.sh leaves out (issue 8):
#  - REBUILD_CREATORS at restore: the restored creator's re-export
#    (cuMemExportToShareableHandle, armed through FAKECUDA_FAIL_DIR before
#    `criu restore`) fails; the restored tree is gone and restore.log names
#    the phase; the next restore of the same images works;
#  - a participant SIGKILLed in the middle of a dump (during SAVE, slowed by
#    FAKECUDA_COPY_US_PER_MB): the dump fails cleanly and the surviving ranks
#    keep running with their gates open, each verifying its own memory, with
#    no FD or mapping leaked.
# Not injectable, on purpose:
#  - INSPECT: the interposer answers it from its own records under the state
#    lock, with no driver call (interposer/checkpoint/ops.c op_inspect); HANDSHAKE is
#    answered by the cuip-ctl thread, so a participant that cannot answer
#    INSPECT (stopped, dead) already fails HANDSHAKE (t-faults.sh) or is the
#    SIGKILL case below. Only a bug (an op thread that never returns) or an
#    op-thread starvation that needs a second rogue client reaches it.
#  - VERIFY: it compares the interposer's records after REBUILD with the
#    topology that REBUILD itself was driven by; every driver failure that
#    could make a mapping differ fails LOAD/REBUILD first (checked here and
#    in t-faults.sh). A VERIFY mismatch means a bug in REBUILD.
#  - RESUME: it makes no driver call (it only reopens the gate) and refuses
#    only a FAILED process or detached memory, both of which fail an earlier
#    phase. A RESUME failure means a bug or a participant that died between
#    VERIFY and RESUME, which no test can time.
. "$srcdir/lib.sh"

export FAKECUDA_FAIL_DIR=$T/faults
export CUINTERPOSE_TEST_QUIESCE_RETRIES=0
# Host<->device copies at ~20 MB/s: SAVE of the shared memory takes about a
# second, a window to kill a rank in.
export FAKECUDA_COPY_US_PER_MB=50000
export CUINTERPOSE_PROGRESS_MS=50
export MALLOC_ARENA_MAX=1
mkdir -p "$FAKECUDA_FAIL_DIR"
N=3


start_job $N
GEN=1
cmd $N write 1 $GEN
cmd $N verify $GEN
before=$(answers $N)
pids=$(job_pids)
p0=$(pid_of 0)

note "dump"
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
logsize=$(stat -c %s "$T/job.log")

# REBUILD_CREATORS: the restored creator cannot export its memory again.
note "restore fault: cuMemExportToShareableHandle in REBUILD_CREATORS"
arm "$p0" cuMemExportToShareableHandle:1
bounded "$FAKERUN" $SAN_CRIU "$CRIU" restore -D "$T/d" -L "$T/plugins" --shell-job --restore-detached -v4 \
	-o restore-fault.log >/dev/null 2>&1 || : # what counts is below
disarm
wait_gone $pids || fail "REBUILD_CREATORS: restored processes still alive"
truncate -s "$logsize" "$T/job.log"
log=$T/d/restore-fault.log
grep -m1 "cuinterpose: .*REBUILD_CREATORS failed on pid $p0" "$log" ||
	fail "REBUILD_CREATORS: no 'REBUILD_CREATORS failed' in restore.log"
grep -q "cuinterpose: .*\(killing the restored tree\|restore cannot complete\)" "$log" ||
	fail "REBUILD_CREATORS: no clear error in restore.log"
grep -q "REBUILD_IMPORTERS\|VERIFY:" "$log" && fail "REBUILD_CREATORS: later phases ran"

note "restore"
criu_restore "$T/d" || fail "criu restore after the injected failure"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore"

survivors="$(pid_of 0) $(pid_of 1)"
victim=$(pid_of 2)
warm_reference $survivors

# A participant SIGKILLed while SAVE moves the carrier bytes.
note "dump with rank 2 killed during SAVE"
criu_dump "$T/k" >"$T/k.out" 2>&1 &
cpid=$!
i=0
until grep -q "cuinterpose: SAVE in progress" "$T/k/dump.log" 2>/dev/null; do
	i=$((i + 1))
	[ $i -gt 400 ] && fail "SAVE never started"
	alive $cpid || fail "criu dump ended before SAVE: $(tail -5 "$T/k/dump.log")"
	nap 0.01
done
kill -9 "$victim"
wait $cpid && fail "criu dump succeeded without rank 2"
note "dump failed"
wait_gone "$victim" || fail "rank 2 still alive"
grep -m1 "cuinterpose: .*\(failed\|refused\|timed out\|closed\|died\)" "$T/k/dump.log" ||
	fail "no cuinterpose error in dump.log"
grep -q "ROLLBACK FAILED" "$T/k/dump.log" && fail "rollback failed: $(grep -m1 'ROLLBACK FAILED' "$T/k/dump.log")"
grep -q "cuinterpose: pid $victim died during the dump; rolling back the other participants" "$T/k/dump.log" ||
	fail "the dead rank is not named in dump.log"
grep -q "cuinterpose: rollback complete" "$T/k/dump.log" || fail "no completed rollback in dump.log"
for p in $survivors; do alive $p || fail "survivor $p died"; done
# Each survivor verifies its own memory (open gate: the calls go through).
cmd 2 verify $GEN
[ "$(answers 2)" = "$(echo "$before" | head -2)" ] || fail "survivors' addresses changed"
census_back 5 "survivors" $survivors
cmd 2 exit
note done
