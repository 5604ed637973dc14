# A restore whose LOAD stops making progress (#32): rank 0's host-to-device
# copies never complete (the fake driver hangs its first cuStreamSynchronize
# after the dump: cuStreamSynchronize:1:HANG through FAKECUDA_FAIL_DIR). With
# CUINTERPOSE_STALL_TIMEOUT_MS=2000 the plugin gives LOAD up about 2 s after
# its last byte moved, whatever the carrier's size, names the stall and the
# pid in restore.log and kills the restored tree. The images are only read:
# the same images restore fine once the fault is gone, every byte and
# address intact.
. "$srcdir/lib.sh"

export FAKECUDA_FAIL_DIR=$T/faults
mkdir -p "$FAKECUDA_FAIL_DIR"
STALL_MS=2000
LIMIT_S=60 # the stalled restore's bound; without the stall bound it waits forever

start_job 2
GEN=1
cmd 2 write 0 $GEN
cmd 2 verify $GEN
before=$(answers 2)
pids=$(job_pids)
p0=$(pid_of 0)
note dump
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
logsize=$(stat -c %s "$T/job.log")
images=$(cd "$T/d" && sha256sum -- *.img)

note "restore with rank 0's copies hanging"
arm "$p0" "cuStreamSynchronize:1:HANG"
t0=$(now_ms)
CRIU_LIMIT_S=$LIMIT_S CUINTERPOSE_STALL_TIMEOUT_MS=$STALL_MS criu_restore "$T/d" >"$T/r1.out" 2>&1
rc=$?
dt=$(($(now_ms) - t0))
cat "$T/r1.out"
[ $rc = 124 ] &&
	fail "criu restore hung for $LIMIT_S s despite the stall bound and was killed; its log: $T/d/restore.log"
[ $rc = 0 ] && fail "criu restore succeeded with a stalled LOAD"
[ -e "$FAKECUDA_FAIL_DIR/hung.$p0" ] || fail "the hang was never reached: $(grep cuinterpose "$T/d/restore.log" | tail -5)"
grep "LOAD failed on pid $p0: no progress for 2 s in LOAD ([0-9]* of [0-9]* bytes moved)" "$T/d/restore.log" ||
	fail "restore.log does not name the stall: $(grep -E "LOAD|in progress" "$T/d/restore.log")"
load_s=$(sed -nE 's/.*cuinterpose: LOAD: .* ([0-9]+\.[0-9]+) s(, [0-9.]+ [MG]B\/s)? \(FAILED\).*/\1/p' "$T/d/restore.log")
[ -n "$load_s" ] || fail "no failed LOAD line in restore.log"
awk -v s="$load_s" -v b="$STALL_MS" 'BEGIN { exit !(s * 1000 >= b && s * 1000 < b + 3000) }' ||
	fail "LOAD failed after $load_s s, not within its stall bound of $STALL_MS ms"
echo "LOAD failed after $load_s s; criu restore exited $rc after $dt ms"
grep -q "killing the restored tree" "$T/d/restore.log" || fail "restored tree not killed"
wait_gone $pids || fail "a restored process is still alive: $(ps -o pid,stat,cmd -p "$(echo $pids | tr ' ' ,)")"
[ "$(cd "$T/d" && sha256sum -- *.img)" = "$images" ] || fail "the failed restore changed the images"
[ "$(stat -c %s "$T/job.log")" = "$logsize" ] ||
	fail "the killed restore wrote into the job's log: $(tail -c +$((logsize + 1)) "$T/job.log" | head -3)"

note "restore without the fault"
disarm
CRIU_LIMIT_S=$LIMIT_S criu_restore "$T/d" -o restore-2.log ||
	fail "criu restore of the same images without the fault (its log: $T/d/restore-2.log)"
cmd 2 verify $GEN
[ "$(answers 2)" = "$before" ] || fail "addresses changed: $(answers 2) vs $before"
cmd 2 exit
note done
