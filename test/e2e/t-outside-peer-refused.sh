# Dumping only the importer: its creator is a sharing peer outside the
# dumped tree; the dump is refused naming both, the job keeps running.
. "$srcdir/lib.sh"

start_job 2
creator=$JOBPID
importer=$(awk '{print $2}' "$T/w/r1.ready")
JOBPID=$importer
note dump
criu_dump "$T/d" && fail "criu dump of the importer alone succeeded"
grep -q "pid $importer imports allocation .* from pid $creator" "$T/d/dump.log" ||
	fail "refusal does not name both processes"
for p in $(job_pids); do alive $p || fail "pid $p died"; done
cmd 2 write 1 4
cmd 2 verify 4
cmd 2 exit
note done
