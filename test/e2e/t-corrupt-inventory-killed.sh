# A corrupted cuinterpose image is refused at restore, naming the file, and
# the restored tree is killed instead of resuming (CRIU ignores the hook's
# return value, so the plugin kills it itself).
. "$srcdir/lib.sh"

setsid "$FAKERUN" "$WORKLOAD" "$T/w" 2 --private </dev/null >"$T/job.log" 2>&1 &
JOB=$!
wait_ready 2
pids=$(job_pids)
note dump
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
flip_byte "$T/d/cuinterpose-inventory.img" 20
note restore
criu_restore "$T/d" && echo "(criu restore exited 0)"
grep -q "cuinterpose-inventory.img: .*checksum" "$T/d/restore.log" || fail "restore.log does not name the image"
grep -q "killing the restored tree" "$T/d/restore.log" || fail "restored tree not killed"
wait_gone $pids || fail "restored processes still alive"
JOB=
note done
