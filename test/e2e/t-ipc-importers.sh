# Legacy IPC: one exporter (cuMemAlloc + cuIpcGetMemHandle) and two
# importers (each opens every handle twice), through two checkpoint/restore
# cycles. After each restore: every byte, every address and size, writes by
# an importer seen by all, a fresh IPC handle opened by every importer, and
# a reopen of a handle kept across the checkpoint at the same address.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_ipc
ipc_cycles() { # NPROCS [--two-devices]
	n=$1
	start_job "$@"
	cmd $n verify 0
	before=$(answers $n)
	gen=0
	for cycle in 1 2; do
		pids=$(job_pids)
		criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
		wait_gone $pids || fail "dumped processes still alive"
		criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
		cmd $n verify $gen
		[ "$(answers $n)" = "$before" ] || fail "addresses changed: $(answers $n) vs $before"
		gen=$((gen + 1))
		cmd $n write 1 $gen
		cmd $n verify $gen
		cmd $n fresh
		cmd $n reopen
		cmd $n verify $gen
	done
	cmd $n exit
}
ipc_cycles 3
note done
