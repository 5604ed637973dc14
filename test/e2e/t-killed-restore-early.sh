# criu SIGKILLed inside its own restore, before RESUME_DEVICES_LATE: while
# it forks the tree and the tasks fill themselves in (memory, files) and
# wait in CRIU's restorer for criu's next step. The restore's guardian,
# started at init(RESTORE) and knowing the tree from the images'
# pstree.img, kills every task of the tree that this restore created, says
# which in its log next to the images, and the same images then restore
# with every byte and address intact (a task left behind would hold a pid
# of the images: "Can't fork for PID: File exists").
# Kill points: the plugin's fault points of that span (kill@restore-init,
# criu has forked nothing; kill@post-forking, CRIU's POST_FORKING hook,
# the root forked), then at landmarks of criu's own log (the first fork,
# a task restoring its resources, a task entering the restorer blob) and
# at delays after the guardian started; each kill waits on its event. A
# timed kill that this machine's restore outran (criu committed first)
# finds the job intact and dumps it again. Last, an init(RESTORE) that
# cannot fork (a pids cgroup at its limit) refuses the restore before criu
# forks anything: the GPU query's child, then the guardian.
. "$srcdir/lib.sh"

export MALLOC_ARENA_MAX=1
N=3
K=0

CUINTERPOSE_LOG=2 start_job $N
GEN=1
cmd $N write 2 $GEN
cmd $N verify $GEN
before=$(answers $N)
pids=$(echo $(job_pids))
note "dump"
criu_dump "$T/d" || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
logsize=$(stat -c %s "$T/job.log")
glog=$T/d/cuinterpose-guardian.log

# what of the tree runs, for a failure
left_report() {
	local p
	for p in $pids; do
		[ -d /proc/$p ] && ps -o pid=,ppid=,stat=,comm= -p "$p"
	done
}

# after_kill WHAT LOG: criu is dead; the guardian's verdict (bounded), then
# nothing of the tree left and nothing written by it
after_kill() {
	local what=$1 log=$T/d/$2 g p left=

	g=$(sed -n 's/.*guardian pid \([0-9]*\) watches this restore.*/\1/p' "$log" | head -n1)
	if grep -q "Restore finished successfully" "$log"; then
		fail "$what: the restore committed before the kill; the kill comes too late"
	fi
	if [ -n "$g" ]; then
		waiting "guardian $g's verdict"
		for _ in $(seq 1200); do
			live "$g" || break
			nap 0.05
		done
		waited
		live "$g" &&
			fail "$what: guardian $g still runs after 60 s: $(cat "$glog" 2>&1)"
		grep -q "restored tree killed [0-9.]* s after criu was lost" "$glog" ||
			fail "$what: no verdict of the guardian: $(cat "$glog" 2>&1)"
		grep -q "before the restore's commit point: killing the restored tree" "$glog" ||
			fail "$what: the guardian does not say why it acted: $(cat "$glog")"
	else
		# killed before the plugin's init: criu forked nothing
		grep -q "Forking task with" "$log" && fail "$what: the tree was forked, with no guardian: $(left_report)"
		[ ! -e "$glog" ] || fail "$what: a guardian log with no guardian: $(cat "$glog")"
	fi
	# the guardian waited until its kills were done: nothing may run now
	for p in $pids; do
		live "$p" && left="$left $p"
	done
	[ -z "$left" ] || fail "$what: restored process(es)$left still alive after the guardian's verdict:
$(left_report)
$(cat "$glog" 2>&1)"
	for p in $(sed -n 's/.*killed pid \([0-9]*\) .*/\1/p' "$glog" 2>/dev/null); do
		case " $pids " in *" $p "*) ;; *) fail "$what: the guardian killed pid $p, not of the images" ;; esac
	done
	[ "$(stat -c %s "$T/job.log")" = "$logsize" ] ||
		fail "$what: the killed restore wrote into the job's log: $(tail -c +$((logsize + 1)) "$T/job.log" | head -3)"
	echo "$what: $(cat "$glog" 2>/dev/null | grep -c "killed pid") killed; $(grep -h "restored tree killed" "$glog" 2>/dev/null |
		sed 's/.*restored tree killed/restored tree killed/')"
}

# fault points of the plugin before RESUME_DEVICES_LATE
for point in restore-init post-forking; do
	K=$((K + 1))
	note "restore kill $K: kill@$point"
	rm -f "$glog"
	CUINTERPOSE_TEST_FAULT=kill@$point criu_restore "$T/d" -o "restore-$K.log" >"$T/r$K.out" 2>&1 &&
		fail "kill@$point: criu restore succeeded"
	grep -q "fault injection (CUINTERPOSE_TEST_FAULT): kill at $point" "$T/d/restore-$K.log" ||
		fail "kill@$point: the fault did not fire: $(grep "cuinterpose: \|Error" "$T/d/restore-$K.log" | tail -n 5)"
	after_kill "kill@$point" "restore-$K.log"
	case $point in
	restore-init) grep -q "no process of the restored tree exists: nothing to kill" "$glog" ||
		fail "kill@$point: $(cat "$glog")" ;;
	post-forking) grep -q "killed pid ${pids%% *} " "$glog" ||
		fail "kill@$point: the root was not killed: $(cat "$glog")" ;;
	esac
done

# kill_at WHAT PATTERN [DELAY]: start criu restore, SIGKILL criu once its
# log has a line matching PATTERN (and DELAY seconds more)
kill_at() {
	local log restorer c= i

	K=$((K + 1))
	log=restore-$K.log
	note "restore kill $K: $1"
	rm -f "$glog"
	wait_pids_free
	criu_restore "$T/d" -o "$log" >"$T/r$K.out" 2>&1 &
	restorer=$!
	for ((i = 0; i < 6000; i++)); do
		grep -qE "$2" "$T/d/$log" 2>/dev/null && break
		nap 0.01
	done
	grep -qE "$2" "$T/d/$log" || fail "$1: no line /$2/ in criu's log: $(tail -n 5 "$T/d/$log")"
	[ -n "${3:-}" ] && nap "$3"
	c=$(criu_main "$T/d" restore) && kill -9 "$c"
	wait $restorer
	if grep -q "Restore finished successfully" "$T/d/$log"; then
		# a timed kill this machine's restore outran: the job runs
		# restored; it must be intact, and is dumped again for the next
		echo "$1: the restore committed first"
		recommitted "$1"
		return
	fi
	after_kill "$1" "$log"
}

# recommitted WHAT: the restore committed: the job answers as before;
# dump it again into $T/d for the next kills
recommitted() {
	JOBPID=$(pid_of 0)
	cmd $N verify $GEN
	[ "$(answers $N)" = "$before" ] || fail "$1: addresses changed after the committed restore"
	[ ! -e "$glog" ] || fail "$1: the guardian acted on a committed restore: $(cat "$glog")"
	rm -rf "$T/d"
	criu_dump "$T/d" || fail "$1: criu dump after the committed restore"
	wait_gone $pids || fail "$1: dumped processes still alive"
	logsize=$(stat -c %s "$T/job.log")
}

kill_at "at the first fork" "Forking task with"
kill_at "a task restoring its resources" "Restoring resources"
kill_at "a task entering the restorer" "Restore via sigreturn"
for d in 0 0.005 0.015 0.03 0.06; do
	kill_at "$d s after the guardian started" "guardian pid [0-9]* watches this restore" $d
done

# criu stopped inside its restore, before RESUME_DEVICES_LATE: the
# guardian's bound kills it, then the tree
K=$((K + 1))
note "restore kill $K: stop@post-forking"
rm -f "$glog"
CUINTERPOSE_GUARDIAN_STOP_MS=1500 CUINTERPOSE_TEST_FAULT=stop@post-forking criu_restore "$T/d" -o "restore-$K.log" \
	>"$T/r$K.out" 2>&1 && fail "stop@post-forking: criu restore succeeded"
after_kill "stop@post-forking" "restore-$K.log"
grep -q "has been stopped for 1500 ms" "$glog" || fail "stop@post-forking: not killed by the bound: $(cat "$glog")"

# no guardian, no restore: a restore whose init cannot fork what it needs
# refuses at init, before criu forks anything. criu stops at a point of
# init(RESTORE), is moved into a pids cgroup that allows MAX tasks (threads
# count), and goes on, as on a node at its pid limit: at restore-start with
# 1, the child that asks the driver for this machine's GPUs cannot be
# forked; at restore-guardian with 1, the guardian's first fork fails; with
# 2, its second (the guardian itself) fails and no guardian says hello.
PIDS=/sys/fs/cgroup/pids
[ -w "$PIDS" ] || fail "no writable cgroup v1 pids controller at $PIDS for the refused forks"
# refused_at POINT MAX WHAT: the restore stops at POINT, runs on under
# pids.max MAX and is refused with WHAT (a grep pattern)
refused_at() {
	local point=$1 max=$2 what=$3 pcg=$PIDS/cuip-restore-$$-$K restorer criu_pid= p

	K=$((K + 1))
	note "restore $K: its init cannot fork (stopped at $point, pids.max $max)"
	mkdir "$pcg" || fail "cannot create $pcg"
	at_exit "rmdir $pcg 2>/dev/null"
	CUINTERPOSE_TEST_FAULT=stop@$point criu_restore "$T/d" -o "restore-$K.log" >"$T/r$K.out" 2>&1 &
	restorer=$!
	wait_line "$T/d/restore-$K.log" "fault injection \(CUINTERPOSE_TEST_FAULT\): stop at $point"
	waiting "criu stopped at $point"
	for _ in $(seq 200); do
		for p in $(pgrep -x criu); do
			tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q -- "-o restore-$K.log" &&
				[ "$(proc_state "$p")" = "stopped (T)" ] && criu_pid=$p
		done
		[ -n "$criu_pid" ] && break
		nap 0.05
	done
	waited
	[ -n "$criu_pid" ] || fail "no stopped criu restore with restore-$K.log"
	echo "$criu_pid" >"$pcg/cgroup.procs" || fail "cannot move criu $criu_pid into $pcg"
	echo "$max" >"$pcg/pids.max" || fail "cannot set $pcg/pids.max"
	kill -CONT "$criu_pid"
	wait $restorer && fail "pids.max $max: the restore went on"
	grep -q "$what" "$T/d/restore-$K.log" ||
		fail "pids.max $max: no '$what': $(grep "cuinterpose: \|Error" "$T/d/restore-$K.log" | tail -n 5)"
	grep -q "Forking task with" "$T/d/restore-$K.log" && fail "pids.max $max: the refused restore forked the tree"
	[ "$(cat "$pcg/pids.current")" = 0 ] || fail "tasks left in $pcg: $(cat "$pcg/cgroup.procs")"
	rmdir "$pcg"
}
refused_at restore-start 1 \
	"restore refused: cannot fork a child to ask the driver for this machine's GPUs: Resource temporarily unavailable"
refused_at restore-guardian 1 \
	"refusing to restore without a guardian: cannot fork the guardian: Resource temporarily unavailable"
refused_at restore-guardian 2 "refusing to restore without a guardian: the guardian did not start"

note "restore"
rm -f "$glog"
criu_restore "$T/d" || fail "criu restore after the killed attempts: $(grep "Error\|File exists" "$T/d/restore.log" | head -3)"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore"
[ ! -e "$glog" ] || fail "the guardian acted on a committed restore: $(cat "$glog")"
cmd $N exit
note done
