# A process that begins CUDA while a checkpoint is under way never slips
# through half-way. Both orders, in one dump, driven by events only:
#   rank 3 is inside its first cuInit when the plugin discovers the tree
#   (held there by the fake driver): the plugin waits for it ("is starting
#   CUDA: waiting") and it joins as a participant;
#   rank 2 calls its first cuInit after discovery (posted once the plugin
#   says it waits for rank 3): it waits at the start gate ("starting CUDA
#   waits"), is dumped as an ordinary process, and proceeds afterwards.
# Cycle A: --leave-running: the waiter proceeds after the in-place restore
# and works. Cycle B (a new job): the dump ends the job; after the restore
# the restored waiter proceeds and works; then one more full cycle with
# everyone a participant.
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

# during_dump DIR [criu args]: the choreography above; criu runs meanwhile.
during_dump() {
	local d=$1 s3 s2 cpid

	shift
	rm -f "$T/w/hold" "$T/w/hold.held"
	post cuda 3 0
	s3=$SEQ
	for r in 0 1 2; do answered $r $s3; done
	wait_file "$T/w/hold.held" # rank 3 is inside cuInit (marker STARTING)
	criu_dump "$d" "$@" &
	cpid=$!
	wait_line "$d/dump.log" "pid $HELD \(e2e_proc\) is starting CUDA: waiting for it to finish"
	post cuda 2 0
	s2=$SEQ
	for r in 0 1; do answered $r $s2; done
	wait_line "$T/job.log" "cuinterpose\[$WAITER\]: starting CUDA waits: a checkpoint is in progress"
	touch "$T/w/hold" # rank 3 may finish its cuInit now
	wait $cpid || fail "criu dump $* with CUDA starting during it"
	has_line "$d/dump.log" "pid $HELD finished starting CUDA \(started\)" "rank 3 was not waited for"
	has_line "$d/dump.log" "3 participants, 3 CUDA processes, 1 with the interposer but no CUDA" \
		"wrong classification"
	has_line "$d/dump.log" "pid $WAITER \(e2e_proc\) maps the interposer but has not initialized CUDA" \
		"the waiter is not an ordinary process"
	S3=$s3 S2=$s2
}

note "cycle A: --leave-running"
start_proc 4 --held
HELD=$(rank_pid 3) WAITER=$(rank_pid 2)
during_dump "$T/dA" --leave-running
has_line "$T/dA/dump.log" "in-place restore complete" "no in-place restore"
answered 3 $S3
answered 2 $S2
answered 3 $S2
has_line "$T/job.log" "cuinterpose\[$WAITER\]: start gate passed" "the waiter did not pass the gate"
cmd 4 write 0 3
cmd 4 verify 3
criu_dump "$T/dA2" --leave-running || fail "a dump once both use CUDA"
has_line "$T/dA2/dump.log" "4 participants, 4 CUDA processes, 0 with the interposer but no CUDA" \
	"the late starters are not participants"
cmd 4 verify 3
job_exit 4 || fail "the job did not exit"

note "cycle B: dump, restore, the restored waiter proceeds"
SEQ=0
start_proc 4 --held
HELD=$(rank_pid 3) WAITER=$(rank_pid 2)
during_dump "$T/dB"
answered 3 $S3 # rank 3 finished its command before it was frozen, or after restore
wait_gone $(job_pids) || fail "the dumped job did not exit"
criu_restore "$T/dB" || fail "criu restore of a job with a process waiting at the start gate"
answered 3 $S3
answered 2 $S2
answered 3 $S2
cmd 4 verify 0
cmd 4 write 3 4
cmd 4 verify 4
note "cycle B2: everyone a participant"
criu_dump "$T/dB2" || fail "dump after the restore"
has_line "$T/dB2/dump.log" "4 participants, 4 CUDA processes, 0 with the interposer but no CUDA" \
	"the restored waiter is not a participant"
wait_gone $(job_pids) || fail "the dumped job did not exit"
criu_restore "$T/dB2" || fail "second restore"
cmd 4 verify 4
cmd 4 exit
note done
