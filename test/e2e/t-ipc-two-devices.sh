# Legacy IPC across two fake devices with peer access: the exporter on
# device 0, importers on devices 1 and 0; device 1 keeps read-write access to
# every buffer (peer access mirrored into VMM access) across two cycles.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_ipc
export FAKECUDA_DEVICES=2
start_job 3 --two-devices
cmd 3 verify 0
before=$(answers 3)
for cycle in 1 2; do
	pids=$(job_pids)
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	wait_gone $pids || fail "dumped processes still alive"
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	cmd 3 verify $((cycle - 1))
	[ "$(answers 3)" = "$before" ] || fail "addresses changed: $(answers 3) vs $before"
	cmd 3 write 1 $cycle
	cmd 3 verify $cycle
	cmd 3 fresh
	cmd 3 reopen
done
cmd 3 exit
note done
