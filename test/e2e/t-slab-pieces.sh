# Small cuMemAlloc buffers as pieces of slabs: 400 buffers of odd and round
# sizes (freed and allocated again among them) in rank 0, two of them
# IPC-shared with two importers, through two checkpoint/restore cycles.
# After each restore: every byte, every address (rank 0 hashes all of them)
# and cuMemGetAddressRange of every buffer, a write by an importer seen by
# all, then freeing half the restored buffers and allocating them again.
# The carrier holds one entry per live piece of the shared slab and nothing
# of its free space.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_slab
CLI=$B/plugin/cuinterpose
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
cmd $n exit

# The creator's shared slab: its live pieces (show prints them under the
# allocation) are exactly what its carrier entries hold.
awk '
	/^  [0-9a-f]+:[0-9]+  size / {
		id = $1
		inslab = / owner shared / && / origin malloc / && / creator this process/
		next
	}
	inslab && /^      piece \+/ { want[id " " $2] = $4; np++ }
	/^  [0-9a-f]+:[0-9]+ piece \+/ { got[$1 " " $3] = $8; ne++ }
	END {
		if (np == 0) { print "no shared slab pieces in show"; exit 1 }
		for (k in want) if (got[k] != want[k]) { print "piece " k ": carrier " got[k] ", live " want[k]; exit 1 }
		if (ne != np) { print ne " carrier entries for " np " live pieces"; exit 1 }
		print np " live pieces of shared slabs, one carrier entry each"
	}' "$T/show1.txt" || { cat "$T/show1.txt"; fail "carrier entries of the shared slab"; }
note done
