# The job's pause follows what changed, not how much memory it holds: SAVE
# decides zero and unchanged chunks on the device (the fake runs the chunk
# scan kernel's C version where it keeps device memory), so that
#  - a job with a 2 GiB allocation of zeros (E2E_RESERVED_MB), dumped right
#    after a pre-copy it has not changed since, copies no chunk to the host:
#    the SAVE summary says "0 bytes copied to the host", the fake's copy log
#    (FAKECUDA_COPY_LOG) holds only the scan's results (24 bytes a chunk),
#    and the incremental line counts 0 bytes written, the 2 GiB all zero;
#  - the restore sets the zero chunks with a device memset (the interposer
#    says so for at least 2 GiB) and the job finds every byte and address;
#  - a scan several times longer than the stall bound (each launch held
#    200 ms, FAKECUDA_KERNEL_DELAY_US; 2 GiB in 64 MiB batches, about 7 s)
#    keeps moving the plugin's meter through the progress page: no stall
#    with a 2 s bound (a batch takes at most three launches, 0.6 s), and
#    the progress lines count the bytes scanned on the device.
. "$srcdir/lib.sh"

need_holes
CLI=$B/cli/cuinterpose
RESV=2048
CHUNK=$((1 << 20)) # the plugin's default chunk size

export E2E_RESERVED_MB=$RESV
export FAKECUDA_COPY_LOG=$T/copies.log
CUINTERPOSE_LOG=2 start_job 1 --private
cmd 1 verify 0
before=$(answers 1)

note "pre-copy of the running job"
"$CLI" precopy "$JOBPID" "$T/pre" >"$T/pre.out" 2>&1 || fail "precopy: $(cat "$T/pre.out")"
cmd 1 verify 0
[ "$(answers 1)" = "$before" ] || fail "the job changed under the pre-copy"

note "dump against the pre-copy, nothing changed since"
: >"$T/copies.log"
pids=$(job_pids)
CUINTERPOSE_PARENT=$T/pre criu_dump "$T/d" || fail "criu dump against the pre-copy"
wait_gone $pids || fail "dumped processes still alive"
summary=$(grep -o 'cuinterpose: SAVE: 1 participants.*' "$T/d/dump.log" | head -n 1)
case $summary in
*", 0 bytes copied to the host"*) ;;
*) fail "the SAVE summary does not say that nothing was copied: '$summary'" ;;
esac
case $summary in
*" scanned on the device"*) ;;
*) fail "the SAVE summary says nothing of the device scan: '$summary'" ;;
esac
grep -Eq "SAVE: [0-9]+ of [0-9]+ carried bytes left to the parent checkpoint $T/pre, 0 written, [0-9]+ all zero" \
	"$T/d/dump.log" || fail "the incremental line: $(grep 'left to the parent' "$T/d/dump.log")"
zero=$(grep -o 'left to the parent checkpoint [^,]*, 0 written, [0-9]* all zero' "$T/d/dump.log" | awk '{print $(NF-2)}')
[ "${zero:-0}" -ge $((RESV << 20)) ] || fail "$zero bytes all zero, fewer than the $RESV MiB reserved"
# What the fake copied to the host during the dump: the scan's results only.
read -r lines big sum < <(awk -v c=$CHUNK '{n++; s += $4; if ($4 >= c) b++} END {print n + 0, b + 0, s + 0}' "$T/copies.log")

chunks=$(((RESV << 20) / CHUNK + 64)) # the reserved chunks and the job's own few
[ "$big" = 0 ] || fail "$big device-to-host copies of a chunk or more during the dump ($lines copies, $sum bytes)"
[ "$sum" -le $((chunks * 24)) ] ||
	fail "$sum bytes copied to the host during the dump, more than the scan's results ($chunks chunks x 24)"
grep -Eq "saved: [0-9]+ bytes scanned on the device in [0-9.]+ s \([0-9.]+ GB/s\), 0 copied to the host" "$T/job.log" ||
	fail "the interposer's SAVE line: $(grep 'scanned on the device' "$T/job.log" | tail -n 2)"

note "restore: zero chunks set by a device memset"
criu_restore "$T/d" || fail "criu restore"
set_bytes=$(grep -o 'loaded: [0-9]* bytes of zero chunks set by a device memset' "$T/job.log" | tail -n 1 | awk '{print $2}')
[ "${set_bytes:-0}" -ge $((RESV << 20)) ] ||
	fail "the restore set ${set_bytes:-no} bytes by memset, fewer than the $RESV MiB of zeros"
cmd 1 verify 0
[ "$(answers 1)" = "$before" ] || fail "answers differ after the restore: $(answers 1) vs $before"
cmd 1 exit
wait_gone $(job_pids) || fail "the restored job did not exit"

note "a scan longer than the stall bound is not a stall"
unset FAKECUDA_COPY_LOG
FAKECUDA_KERNEL_DELAY_US=200000 CUINTERPOSE_LOG=2 start_job 1 --private
cmd 1 verify 0
before=$(answers 1)
pids=$(job_pids)
CUINTERPOSE_STALL_TIMEOUT_MS=2000 CUINTERPOSE_PROGRESS_MS=500 criu_dump "$T/s" ||
	fail "the dump of a slow scan failed: $(grep -E 'no byte moved|stall|Error' "$T/s/dump.log" | tail -n 3)"
wait_gone $pids || fail "dumped processes still alive"
grep -q "no byte moved" "$T/s/dump.log" && fail "the stall bound fired during the scan"
grep -Eq "SAVE in progress: .*scanned on the device" "$T/s/dump.log" ||
	fail "no progress line counts the bytes scanned: $(grep 'SAVE in progress' "$T/s/dump.log" | head -n 3)"
criu_restore "$T/s" || fail "criu restore of the slow-scan dump"
cmd 1 verify 0
[ "$(answers 1)" = "$before" ] || fail "answers differ after the second restore"
cmd 1 exit
note done
