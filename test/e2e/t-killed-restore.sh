# criu killed part-way through a restore (#21): at each restore phase
# (CUINTERPOSE_TEST_FAULT=kill@POINT) and stopped beyond the guardian's bound.
# Each time the guardian kills the half-built tree (nothing of it keeps
# running), says so in its log next to the images, and the same images
# restore fine afterwards, every byte and address intact. The job logs at
# info level into a file: a restore killed before RESUME leaves that file as
# it was at dump (a process restored from images holds its lines from its
# LOAD or REBUILD to RESUME; CRIU refuses to restore a file whose size
# changed), and the restore that commits writes them. Killed at RESUME, the
# processes have written them already: the test cuts the log back to its
# size at dump there (README, "When criu dies part-way").
. "$srcdir/lib.sh"

export MALLOC_ARENA_MAX=1
N=3
K=0

CUINTERPOSE_LOG=2 start_job $N
GEN=1
cmd $N write 2 $GEN
cmd $N verify $GEN
before=$(answers $N)
pids=$(job_pids)
note "dump"
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
logsize=$(stat -c %s "$T/job.log")
glog=$T/d/cuinterpose-guardian.log

# killed_restore SPEC: criu dies at SPEC's point; the tree must be gone.
killed_restore() {
	K=$((K + 1))
	note "restore kill $K: $1"
	rm -f "$glog"
	if CUINTERPOSE_TEST_FAULT=$1 criu_restore "$T/d" -o "restore-$K.log" >"$T/r$K.out" 2>&1; then
		: # the shell's wait ends when criu dies or stops; the guardian decides
	fi
	for _ in $(seq 600); do
		grep -qs "restored tree killed" "$glog" && break
		nap 0.05
	done
	grep -qs "restored tree killed" "$glog" || fail "$1: the guardian did not kill the tree: $(cat "$glog" 2>&1)"
	grep -q "fault injection (CUINTERPOSE_TEST_FAULT): ${1%@*} at ${1#*@}" "$T/d/restore-$K.log" ||
		fail "$1: the fault did not fire"
	wait_gone $pids || fail "$1: a restored process is still alive"
	grep -h "restored tree killed" "$glog" | sed 's/.*restored tree killed/restored tree killed/'
	if [ "${1#*@}" = RESUME ]; then
		truncate -s "$logsize" "$T/job.log"
	else
		[ "$(stat -c %s "$T/job.log")" = "$logsize" ] ||
			fail "$1: the killed restore wrote into the job's log: $(tail -c +$((logsize + 1)) "$T/job.log" | head -3)"
	fi
}

for point in native-restore LOAD REBUILD_CREATORS REBUILD_IMPORTERS VERIFY RESUME; do
	killed_restore kill@$point
done
CUINTERPOSE_GUARDIAN_STOP_MS=1500 killed_restore stop@LOAD
grep -q "has been stopped for 1500 ms" "$glog" || fail "stopped restore: not killed by the bound"

# The restore's guardian killed: criu does not go on without it and kills
# the tree itself.
K=$((K + 1))
note "restore kill $K: kill-guardian@LOAD"
CUINTERPOSE_TEST_FAULT=kill-guardian@LOAD criu_restore "$T/d" -o "restore-$K.log" >"$T/r$K.out" 2>&1
grep -q "is gone: refusing to go on with REBUILD_CREATORS without it" "$T/d/restore-$K.log" ||
	fail "no refusal after the restore's guardian died: $(grep cuinterpose "$T/d/restore-$K.log" | tail -5)"
grep -q "killing the restored tree" "$T/d/restore-$K.log" || fail "criu did not kill the tree without its guardian"
wait_gone $pids || fail "kill-guardian: a restored process is still alive"
[ "$(stat -c %s "$T/job.log")" = "$logsize" ] || fail "kill-guardian: the killed restore wrote into the job's log"

note "restore"
rm -f "$glog"
criu_restore "$T/d" || fail "criu restore after the killed attempts"
# the lines held during the committed restore come out at RESUME
[ "$(tail -c +$((logsize + 1)) "$T/job.log" | grep -c "loaded [0-9]* carrier entries")" -ge 1 ] ||
	fail "the committed restore's lines were not written: $(tail -c +$((logsize + 1)) "$T/job.log" | head -3)"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore"
[ ! -e "$glog" ] || fail "the guardian acted on a committed restore: $(cat "$glog")"
cmd $N exit
note done
