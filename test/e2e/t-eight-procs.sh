# Eight processes, one per (fake) GPU, as a tensor-parallel job runs them:
# rank 0 creates the shared allocations on GPU 0, ranks 1-7 import and map
# them for their own GPU. Two checkpoint/restore cycles; after each, every
# byte and address, a write through one rank seen by all, a fresh
# export/import.
. "$srcdir/lib.sh"

export FAKECUDA_DEVICES=8 E2E_SPREAD=1
start_job 8
cmd 8 verify 0
before=$(answers 8)
gen=0
for cycle in 1 2; do
	pids=$(job_pids)
	note "cycle $cycle: dump"
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	grep -q "NATIVE Checkpoint: 8 processes" "$T/d$cycle/dump.log" || fail "no parallel native checkpoint of 8"
	wait_gone $pids || fail "dumped processes still alive"
	note "cycle $cycle: restore"
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	cmd 8 verify $gen
	[ "$(answers 8)" = "$before" ] || fail "addresses changed"
	gen=$((gen + 1))
	cmd 8 write 7 $gen
	cmd 8 verify $gen
	cmd 8 fresh
done
grep -h "NATIVE" "$T"/d*/dump.log "$T"/d*/restore.log | sed 's/^/  /'
cmd 8 exit
note done
