# One process driving two fake devices with a process-private (handle type
# 0) multicast object and a member on each device: torn down before the
# native checkpoint and rebuilt inside the process after restore.
. "$srcdir/lib.sh"
export FAKECUDA_DEVICES=2
WORKLOAD=$B/test/e2e/e2e_mc
[ -x "$WORKLOAD" ] || skip "workload not built"

start_job 1 4 --private
cmd 1 write 0 0
cmd 1 verify 0
before=$(answers 1)
pids=$(job_pids)
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped process still alive"
criu_restore "$T/d" || fail "criu restore"
cmd 1 verify 0
[ "$(answers 1)" = "$before" ] || fail "addresses changed"
cmd 1 write 0 7
cmd 1 verify 7
cmd 1 exit
note done
