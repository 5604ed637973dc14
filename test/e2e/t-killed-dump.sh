# criu killed part-way through a dump (#21): at every phase boundary
# (CUINTERPOSE_FAULT=kill@POINT), SIGSTOPped beyond the guardian's bound,
# and with its guardian or native agent killed. Each time the job answers
# with every byte, address and sharing intact, no FD or mapping leaked, the
# guardian's log next to the images and the job's stderr say what happened,
# and the next dump still works. One job serves every kill point.
. "$srcdir/lib.sh"

export CUINTERPOSE_QUIESCE_RETRIES=0
export MALLOC_ARENA_MAX=1 # see t-faults.sh
N=3
K=0

snapshot() {
	for p in $(job_pids); do
		echo "$p fds $(ls /proc/$p/fd | wc -l) maps $(wc -l </proc/$p/maps)"
		awk '{print $1, $6}' /proc/$p/maps >"$T/maps.$p.now"
		ls -l /proc/$p/fd | awk '{print $9, $11}' >"$T/fds.$p.now"
	done
}

intact() {
	for p in $(job_pids); do alive $p || fail "$1: pid $p died"; done
	cmd $N verify $GEN
	[ "$(answers $N)" = "$before" ] || fail "$1: addresses changed"
	same=0
	for _ in $(seq 20); do
		[ "$(snapshot)" = "$snap" ] && { same=1; break; }
		sleep 0.1
	done
	[ $same = 1 ] || fail "$1: FDs or mappings leaked: before
$snap
after
$(snapshot)
$(for f in "$T"/*.ref; do diff "$f" "${f%.ref}.now"; done)"
}

# guardian_done DIR: wait for the guardian's verdict in DIR's log (it is
# written when the rollback has finished; bounded, not a pacing sleep).
guardian_done() {
	glog=$1/cuinterpose-guardian.log
	for _ in $(seq 600); do
		grep -qs "rollback complete\|ROLLBACK FAILED" "$glog" && break
		sleep 0.05
	done
	grep -qs "rollback complete" "$glog" || fail "no completed rollback in $glog: $(cat "$glog" 2>&1)"
	grep -h "rollback complete" "$glog" | sed 's/.*rollback complete/rollback complete/'
}

# killed POINT [ACTION]: criu dies at POINT; the guardian rolls back.
killed() {
	K=$((K + 1))
	note "kill $K: ${2:-kill}@$1"
	if CUINTERPOSE_FAULT=${2:-kill}@$1 criu_dump "$T/f$K" >"$T/f$K.out" 2>&1; then
		fail "$1: criu dump succeeded"
	fi
	grep -q "fault injection (CUINTERPOSE_FAULT): ${2:-kill} at $1" "$T/f$K/dump.log" ||
		fail "$1: the fault did not fire"
	guardian_done "$T/f$K"
	intact "kill at $1"
}

start_job $N
GEN=0
cmd $N write 1 $GEN
cmd $N verify $GEN
before=$(answers $N)
criu_dump "$T/warm" --leave-running || fail "warm-up dump"
cmd $N verify $GEN
snap=$(snapshot)
for f in "$T"/*.now; do mv "$f" "${f%.now}.ref"; done

for point in discovery QUIESCE PREPARE_MULTICAST SAVE IMAGES PREPARE_UNICAST native-lock native-checkpoint memdump; do
	killed $point
done
grep -q "criu went away in the middle of a checkpoint" "$T/job.log" || fail "nothing in the job's stderr"

note done
cmd $N exit
