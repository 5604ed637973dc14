# CUDA processes without the interposer and without sharing: the plugin
# alone drives native checkpoint (lock, checkpoint with the restore thread
# thawed, restore and unlock at RESUME_DEVICES_LATE); twice in a row.
. "$srcdir/lib.sh"

setsid "$FAKERUN" "$WORKLOAD" "$T/w" 2 --private </dev/null >"$T/job.log" 2>&1 &
JOB=$!
wait_ready 2
cmd 2 verify 0
before=$(answers 2)
for cycle in 1 2; do
	pids=$(job_pids)
	note "cycle $cycle: dump"
	criu_dump "$T/d$cycle" || fail "criu dump"
	grep -q "NATIVE Checkpoint: 2 processes" "$T/d$cycle/dump.log" || fail "no native checkpoint line"
	wait_gone $pids || fail "dumped processes still alive"
	note "cycle $cycle: restore"
	criu_restore "$T/d$cycle" || fail "criu restore"
	grep -q "NATIVE Restore: 2 processes" "$T/d$cycle/restore.log" || fail "no native restore line"
	cmd 2 verify 0
	[ "$(answers 2)" = "$before" ] || fail "addresses changed"
done
cmd 2 exit
note done
