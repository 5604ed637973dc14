# Small cuMemAlloc buffers as pieces of slabs: 400 buffers of odd and round
# sizes (freed and allocated again among them) in rank 0, two of them
# IPC-shared with two importers, through two checkpoint/restore cycles.
# After each restore: every byte, every address (rank 0 hashes all of them)
# and cuMemGetAddressRange of every buffer, a write by an importer seen by
# all, then freeing half the restored buffers and allocating them again.
# Then a dump that fails in rank 0's SAVE (rolled back: the job runs on with
# every byte and address) and a --leave-running dump (in-place restore).
# The carrier holds one entry per live piece of the shared slab and nothing
# of its free space.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_slab
CLI=$B/cli/cuinterpose
export FAKECUDA_FAIL_DIR=$T/faults
mkdir -p "$FAKECUDA_FAIL_DIR"
n=3
start_job $n
cmd $n verify 0
before=$(answers $n)
gen=0
for cycle in 1 2; do
	pids=$(job_pids)
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	wait_gone $pids || fail "dumped processes still alive"
	"$CLI" show "$T/d$cycle" >"$T/show$cycle.txt" 2>&1 || { cat "$T/show$cycle.txt"; fail "show"; }
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	cmd $n verify $gen
	[ "$(answers $n)" = "$before" ] || fail "addresses changed: $(answers $n) vs $before"
	gen=$((gen + 1))
	cmd $n write 1 $gen
	cmd $n verify $gen
	cmd $n churn
	cmd $n verify $gen
	before=$(answers $n)
done

note "rollback"
echo cuMemcpyDtoHAsync:1 >"$FAKECUDA_FAIL_DIR/.tmp" &&
	mv "$FAKECUDA_FAIL_DIR/.tmp" "$FAKECUDA_FAIL_DIR/$(awk '{print $2}' "$T/w/r0.ready")"
criu_dump "$T/f1" >"$T/f1.out" 2>&1 && fail "criu dump with a failing SAVE succeeded"
rm -f "$FAKECUDA_FAIL_DIR"/*
grep -q "SAVE failed" "$T/f1/dump.log" || fail "the dump did not fail in SAVE"
grep -q "rollback complete" "$T/f1/dump.log" || fail "no rollback"
for p in $(job_pids); do alive "$p" || fail "pid $p died in the rollback"; done
cmd $n verify $gen
[ "$(answers $n)" = "$before" ] || fail "rollback: addresses changed: $(answers $n) vs $before"
gen=$((gen + 1))
cmd $n write 2 $gen
cmd $n verify $gen

note "dump --leave-running"
criu_dump "$T/l1" --leave-running || fail "criu dump --leave-running"
grep -q "in-place restore complete" "$T/l1/dump.log" || fail "no in-place restore in dump.log"
for p in $(job_pids); do alive "$p" || fail "pid $p died"; done
cmd $n verify $gen
[ "$(answers $n)" = "$before" ] || fail "--leave-running: addresses changed"
cmd $n churn
cmd $n verify $gen
cmd $n exit

# The creator's carried slabs (shared, and private ones under the default
# CUINTERPOSE_PRIVATE=carrier): their live pieces (show prints them under
# the allocation) are exactly what its carrier entries hold.
awk '
	/^  [0-9a-f]+:[0-9]+  size / {
		id = $1
		inslab = / origin malloc / && / creator this process/ && / carried$/
		next
	}
	inslab && /^      piece \+/ { want[id " " $2] = $4; np++ }
	/^  [0-9a-f]+:[0-9]+ piece \+/ { got[$1 " " $3] = $8; ne++ }
	END {
		if (np == 0) { print "no carried slab pieces in show"; exit 1 }
		for (k in want) if (got[k] != want[k]) { print "piece " k ": carrier " got[k] ", live " want[k]; exit 1 }
		if (ne != np) { print ne " carrier entries for " np " live pieces"; exit 1 }
		print np " live pieces of carried slabs, one carrier entry each"
	}' "$T/show1.txt" || { cat "$T/show1.txt"; fail "carrier entries of the carried slabs"; }
note done
