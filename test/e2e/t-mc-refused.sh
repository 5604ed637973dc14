# Refusals with the job still running: a partial multicast group (only one
# rank of two dumped), and a rank whose device has no binding because its
# bind of untracked memory was refused by the interposer.
. "$srcdir/lib.sh"
export FAKECUDA_DEVICES=2
WORKLOAD=$B/test/e2e/e2e_mc
[ -x "$WORKLOAD" ] || skip "workload not built"

start_job 2 4
cmd 2 write 0 0
cmd 2 verify 0
child=$(awk '{print $2}' "$T/w/r1.ready")
criu_dump "$T/p" -t "$child" && fail "dump of one rank of the team succeeded"
grep -q "pid $child imports allocation .* from pid $JOBPID .*, a sharing peer outside the dumped tree" \
	"$T/p/dump.log" || fail "no reason in dump.log"
alive "$child" || fail "rank 1 died"
cmd 2 write 1 3
cmd 2 verify 3
cmd 2 exit
wait "$JOB"

start_job 2 4 --untracked 1
cmd 2 write 0 0
cmd 2 verify 0
criu_dump "$T/u" && fail "dump with an unbound device succeeded"
grep -q "has no binding" "$T/u/dump.log" || fail "no reason in dump.log"
cmd 2 write 0 5
cmd 2 verify 5
cmd 2 exit
note done
