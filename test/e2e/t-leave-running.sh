# criu dump --leave-running: the job is restored in place (native restore,
# rebuild of the shared memory, gates reopened) and keeps working; a second
# --leave-running dump of the same job works too.
. "$srcdir/lib.sh"

start_job 2
cmd 2 verify 0
before=$(answers 2)
for i in 1 2; do
	note "dump $i"
	criu_dump "$T/d$i" --leave-running || fail "criu dump --leave-running"
	grep -q "in-place restore complete" "$T/d$i/dump.log" || fail "no in-place restore in dump.log"
	for p in $(job_pids); do alive $p || fail "pid $p died"; done
	cmd 2 verify $((i - 1))
	[ "$(answers 2)" = "$before" ] || fail "addresses changed"
	cmd 2 write 1 $i
	cmd 2 verify $i
	cmd 2 fresh
done
cmd 2 exit
note done
