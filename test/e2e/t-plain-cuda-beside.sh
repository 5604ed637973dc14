# A CUDA process without the interposer beside preloaded ones. It cannot
# import tracked memory at all: a ticket (taken with pidfd_getfd) and an
# emulated IPC handle are nothing its driver knows, and both fail cleanly
# (CUDA_ERROR_INVALID_VALUE = 1 on the fake) while it keeps working. Sharing
# nothing, it goes through native checkpoint: two dump + restore cycles
# with its private bytes checked.
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

start_proc 4 --plain
PLAIN=$(rank_pid 3)
grep -q "ticket-import 1 ipc-open 1" "$T/w/r3.ready" || fail "unexpected results in $(cat "$T/w/r3.ready")"
grep -q libcuinterpose "/proc/$PLAIN/maps" && fail "the plain process maps the interposer"
cmd 4 verify 0
before=$(answers 4)
for c in 1 2; do
	note "cycle $c"
	criu_dump "$T/d$c" || fail "criu dump $c with a CUDA process without the interposer"
	has_line "$T/d$c/dump.log" "pid $PLAIN is a CUDA process" "no native checkpoint for the plain process"
	has_line "$T/d$c/dump.log" "2 participants, 3 CUDA processes, 1 with the interposer but no CUDA" \
		"wrong classification"
	wait_gone $(job_pids) || fail "the dumped job did not exit"
	criu_restore "$T/d$c" || fail "criu restore $c"
	cmd 4 verify $((c - 1))
	[ "$(answers 4)" = "$before" ] || fail "answers changed: $(answers 4)"
	cmd 4 write 0 $c
	cmd 4 verify $c
done
cmd 4 exit
note done
