# Private stream-ordered pools (each rank: a default-pool block from
# cuMemAllocAsync and a block of its own POSIX-capable pool that is never
# exported, on two streams) stay with native checkpoint: two criu cycles,
# every byte and address kept, the pools still allocate and free afterwards.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_pool
[ -x "$WORKLOAD" ] || skip "workload not built"

start_job 2
cmd 2 verify 0
before=$(answers 2)
for cycle in 1 2; do
	for r in 0 1; do cmd 2 write $r $((cycle + 10)); done
	cmd 2 verify $((cycle + 10))
	pids=$(job_pids)
	note "dump $cycle"
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	grep -q "memory pool" "$T/d$cycle/dump.log" && fail "a private pool was refused"
	wait_gone $pids || fail "dumped processes still alive"
	note "restore $cycle"
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	cmd 2 verify $((cycle + 10))
	[ "$(answers 2 | awk '{print $2, $3, $4, $5}')" = "$(echo "$before" | awk '{print $2, $3, $4, $5}')" ] ||
		fail "addresses changed: $(answers 2) vs $before"
	cmd 2 churn
done
cmd 2 write 0 77
cmd 2 write 1 77
cmd 2 verify 77
cmd 2 exit
note done
