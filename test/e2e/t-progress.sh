# Progress of long carrier transfers: with host<->device copies paced at
# ~65 MB/s (FAKECUDA_COPY_US_PER_MB) the 30 MiB SAVE (18 MiB shared, 6 MiB
# private in each process, carried by default) takes about 0.5 s;
# CUINTERPOSE_PROGRESS_MS=50 must log progress lines with a total of
# 30.0 MiB and a percentage in 0..100, and the restore still brings every
# byte back, its CARRIERS line (CUINTERPOSE_VERIFY_BEFORE_RESTORE=1) with a
# throughput.
. "$srcdir/lib.sh"

export FAKECUDA_COPY_US_PER_MB=15000
export CUINTERPOSE_PROGRESS_MS=50

check_progress() { # LOG PHASE
	grep -E "cuinterpose: $2 in progress: [0-9.]+ [KMG]iB of 30\.0 MiB \(([0-9]|[1-9][0-9]|100)%\), [0-9.]+ [MG]B/s, [0-9.]+ s" "$1" ||
		fail "no sane '$2 in progress' line in $1: $(grep -E "in progress|LOAD|RESUME_DEV" "$1")"
}

start_job 2
cmd 2 verify 0
before=$(answers 2)
pids=$(job_pids)
note "dump"
criu_dump "$T/d" || fail "criu dump"
check_progress "$T/d/dump.log" SAVE
grep -q "cuinterpose: SAVE: 2 participants, 7 records, 31457280 bytes" "$T/d/dump.log" || fail "no SAVE line in dump.log"
wait_gone $pids || fail "dumped processes still alive"
note "restore"
CUINTERPOSE_VERIFY_BEFORE_RESTORE=1 criu_restore "$T/d" || fail "criu restore"
grep -E "cuinterpose: CARRIERS verified: [0-9]+ bytes, [0-9.]+ s, [0-9.]+ MB/s" "$T/d/restore.log" ||
	fail "no throughput on the CARRIERS line"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "addresses changed"
cmd 2 exit
note done
