# A corrupted carrier image is refused at restore, naming the file, and
# the restored tree is killed instead of resuming half-built.
. "$srcdir/lib.sh"

start_job 2
cmd 2 verify 0
pids=$(job_pids)
note dump
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
car=$(ls "$T"/d/cuinterpose-carrier-*.img | head -1)
[ -n "$car" ] || fail "no carrier image"
flip_byte "$car" 4099
note restore
criu_restore "$T/d" && echo "(criu restore exited 0)"
grep -q "corrupt" "$T/d/restore.log" || fail "restore.log does not report the corruption"
grep -q "killing the restored tree" "$T/d/restore.log" || fail "restored tree not killed"
wait_gone $pids || fail "restored processes still alive"
JOB=
note done
