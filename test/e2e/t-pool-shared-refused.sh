# A job of 3 processes sharing a stream-ordered pool by FD (rank 0 exports
# the pool and a pointer, the others import both) is refused at preflight,
# naming every pid and pool, before anything changes: the job keeps running
# with every byte. Once the importers and the creator released the pool, a
# dump and restore succeed with the private pools' bytes intact.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_pool
[ -x "$WORKLOAD" ] || skip "workload not built"

start_job 3 --shared
cmd 3 verify 0
before=$(answers 3)
for r in 0 1 2; do cmd 3 write $r 3; done
cmd 3 verify 3
set -- $(job_pids)
p0=$1 p1=$2 p2=$3
note dump
criu_dump "$T/d" && fail "criu dump succeeded with a shared pool"
L=$T/d/dump.log
grep -q "pid $p0 memory pool [0-9]* (device 0) is exported (cuMemPoolExportToShareableHandle)" "$L" ||
	fail "the refusal does not name the creator pid $p0 and its pool"
for p in $p1 $p2; do
	grep -q "pid $p memory pool [0-9]* (device -1) is imported (cuMemPoolImportFromShareableHandle)" "$L" ||
		fail "the refusal does not name importer pid $p and its pool"
done
grep -q "cannot be rebuilt at the same addresses" "$L" || fail "the refusal gives no reason"
grep -q "QUIESCE" "$L" && fail "the job was quiesced before the refusal"
for p in $p0 $p1 $p2; do alive $p || fail "pid $p died"; done
cmd 3 verify 3
[ "$(answers 3 | awk '{print $2, $3, $4, $5, $6, $7}')" = "$(echo "$before" | awk '{print $2, $3, $4, $5, $6, $7}')" ] ||
	fail "addresses changed after the refusal"
cmd 3 write 1 4
cmd 3 write 0 4
cmd 3 write 2 4
cmd 3 verify 4
cmd 3 churn

note release
cmd 3 release-importers
cmd 3 release-creator
cmd 3 verify 4
pids=$(job_pids)
criu_dump "$T/d2" || fail "criu dump after the pool was released"
wait_gone $pids || fail "dumped processes still alive"
criu_restore "$T/d2" || fail "criu restore"
cmd 3 verify 4
cmd 3 churn
cmd 3 exit
note done
