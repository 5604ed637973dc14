# One creator, three importers: checkpoint, restore, every byte and address,
# a write through the last importer seen by all.
. "$srcdir/lib.sh"

start_job 4
cmd 4 write 2 5
cmd 4 verify 5
before=$(answers 4)
pids=$(job_pids)
note dump
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
note restore
criu_restore "$T/d" || fail "criu restore"
cmd 4 verify 5
[ "$(answers 4)" = "$before" ] || fail "addresses changed"
cmd 4 write 3 6
cmd 4 verify 6
cmd 4 fresh
cmd 4 exit
note done
