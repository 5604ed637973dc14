# The importer side alone: dumping only a process that imported a pool (and
# a pointer) from its parent is refused at preflight, naming its pid, before
# anything changes; the whole job keeps running with every byte.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_pool
[ -x "$WORKLOAD" ] || skip "workload not built"

start_job 3 --shared
cmd 3 write 0 6
cmd 3 write 1 6
cmd 3 write 2 6
cmd 3 verify 6
set -- $(job_pids)
p1=$2
mkdir -p "$T/d"
note "dump of pid $p1 only"
bounded "$FAKERUN" $SAN_CRIU "$CRIU" dump -t "$p1" -D "$T/d" -L "$T/plugins" --shell-job -v4 -o dump.log &&
	fail "criu dump of the importer succeeded"
grep -q "pid $p1 memory pool [0-9]* (device -1) is imported" "$T/d/dump.log" ||
	fail "the refusal does not name importer pid $p1"
grep -q "QUIESCE" "$T/d/dump.log" && fail "the importer was quiesced before the refusal"
for p in $(job_pids); do alive $p || fail "pid $p died"; done
cmd 3 verify 6
cmd 3 write 1 9
cmd 3 write 0 9
cmd 3 write 2 9
cmd 3 verify 9
cmd 3 exit
note done
