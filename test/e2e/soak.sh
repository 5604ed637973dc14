# soak.sh N - N checkpoint/restore cycles (criu dump, then criu restore) of a
# four-process sharing job. Each cycle checks every byte and address on all
# ranks, then writes a new generation through one rank (a different one each
# cycle) and checks that all four see it. From cycle 1 on (the first restore
# settles lazily made state) every rank must keep the same number of FDs and
# mappings: nothing leaks. Prints one line per cycle and a summary
# "soak: N cycles, T s, D s/cycle (dump d, restore r), 0 failures"; the
# first failure stops it with a FAIL line naming the cycle.
#
#   make -C test/e2e e2e_group e2e_reaper
#   cd test/e2e && srcdir=$SRC/test/e2e top_builddir=$BUILD \
#       ./e2e_reaper /bin/bash $SRC/test/e2e/soak.sh 100
#
# t-soak-short.sh runs it with N=5 in make check.
. "$srcdir/lib.sh"

SOAK_N=${1:-${SOAK_N:-5}}
NP=4
now() { date +%s.%N; }
since() { echo "$(now) $1" | awk '{printf "%.3f", $1 - $2}'; }
export CENSUS_DEVMEM=1 # lib.sh census: FDs, mappings and device memory

start_job $NP
gen=0
cmd $NP write 0 $gen
cmd $NP verify $gen
before=$(answers $NP)
t0=$(now)
tdump=0
trest=0
for c in $(seq 1 "$SOAK_N"); do
	pids=$(job_pids)
	d=$T/d
	rm -rf "$d"
	t=$(now)
	criu_dump "$d" >"$T/dump.out" 2>&1 || fail "cycle $c: criu dump: $(tail -3 "$T/dump.out")"
	wait_gone $pids || fail "cycle $c: dumped processes still alive"
	td=$(since "$t")
	t=$(now)
	criu_restore "$d" >"$T/restore.out" 2>&1 || fail "cycle $c: criu restore: $(tail -3 "$T/restore.out")"
	grep -q "RESUME_DEVICES_LATE done" "$d/restore.log" || fail "cycle $c: no completion line in restore.log"
	tr=$(since "$t")
	cmd $NP verify $gen
	[ "$(answers $NP)" = "$before" ] || fail "cycle $c: addresses changed: $(answers $NP) vs $before"
	gen=$((gen + 1))
	cmd $NP write $((c % NP)) $gen
	cmd $NP verify $gen
	# the reference is a settled census after cycle 1
	[ $c = 1 ] && census_keep 10
	# A descriptor can exist for a moment (the workload opens its command
	# file while polling; the fake driver holds a copy of an export FD until
	# its queued records go, within 1 ms): a change must persist.
	census_back 5 "cycle $c (reference: after cycle 1)"
	tdump=$(echo "$tdump $td" | awk '{print $1 + $2}')
	trest=$(echo "$trest $tr" | awk '{print $1 + $2}')
	echo "cycle $c: dump ${td}s restore ${tr}s, write through rank $((c % NP)) seen by all"
done
total=$(since "$t0")
echo "$SOAK_N $total $tdump $trest" |
	awk '{printf "soak: %d cycles, %.1f s, %.3f s/cycle (dump %.3f, restore %.3f), 0 failures\n",
		$1, $2, $2 / $1, $3 / $1, $4 / $1}'
cmd $NP exit
