# A creator and an importer, three shared allocations (2, 6 and 10 MiB:
# two are not a multiple of the 4 MiB staging buffer) beside private
# cuMemAlloc and never-shared VMM memory (carried too, the default);
# checkpoint and restore twice.
# After each restore: every byte, every address, the application's handles,
# a write through the importer seen by the creator, a fresh export/import,
# a re-import from a ticket kept across the checkpoint.
. "$srcdir/lib.sh"

start_job 2
cmd 2 verify 0
before=$(answers 2)
gen=0
for cycle in 1 2; do
	pids=$(job_pids)
	note "cycle $cycle: dump"
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	# Both carry their private memory too (CUINTERPOSE_PRIVATE=carrier by
	# default): the creator 18 MiB shared + 4 MiB cuMemAlloc + 2 MiB VMM,
	# the importer its own 6 MiB of private memory; in cycle 2 the creator
	# also holds the 2 MiB of cycle 1's "fresh".
	want="2 participants, 7 records, 31457280 bytes"
	[ $cycle = 2 ] && want="2 participants, 8 records, 33554432 bytes"
	grep -q "cuinterpose: SAVE: $want" "$T/d$cycle/dump.log" || fail "no SAVE line ($want) in dump.log"
	wait_gone $pids || fail "dumped processes still alive"
	note "cycle $cycle: restore"
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	grep -q "RESUME_DEVICES_LATE done" "$T/d$cycle/restore.log" || fail "no completion line in restore.log"
	cmd 2 verify $gen
	[ "$(answers 2)" = "$before" ] || fail "addresses changed: $(answers 2) vs $before"
	gen=$((gen + 1))
	cmd 2 write 1 $gen
	cmd 2 verify $gen
	gen=$((gen + 1))
	cmd 2 write 0 $gen
	cmd 2 verify $gen
	cmd 2 fresh
	cmd 2 reimport
	cmd 2 verify $gen
done
cmd 2 exit
note done
