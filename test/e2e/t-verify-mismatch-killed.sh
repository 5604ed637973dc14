# A topology image that reads back fine (framing and checksum rewritten) but
# no longer matches its process: one mapping's access flags changed. The
# rebuild itself succeeds (it works from the process's restored records);
# VERIFY's digest differs, the record-by-record comparison that follows
# names the mapping, and the restored tree is killed instead of resumed.
. "$srcdir/lib.sh"

start_job 2
cmd 2 verify 0
pids=$(job_pids)
note dump
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
img=$(cd "$T/d" && ls cuinterpose-[0-9]*.img | head -1)
[ -n "$img" ] || fail "no topology image"
"$B/test/e2e/e2e_retopo" "$T/d" "$img" || fail "cannot rewrite $img"
note restore
criu_restore "$T/d" && echo "(criu restore exited 0)"
grep -q "digest .* is not the checkpoint's .*comparing record by record" "$T/d/restore.log" ||
	fail "restore.log does not show the digest mismatch"
grep -q "VERIFY failed.*mapping at 0x[0-9a-f]* of allocation .* differs from the checkpoint" "$T/d/restore.log" ||
	fail "restore.log does not name the mapping"
grep -q "killing the restored tree" "$T/d/restore.log" || fail "restored tree not killed"
wait_gone $pids || fail "restored processes still alive"
JOB=
note done
