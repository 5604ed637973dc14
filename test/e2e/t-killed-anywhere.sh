# criu SIGKILLed anywhere in a dump or a restore of a 3-process job (#45):
# at every plugin fault point (CUINTERPOSE_TEST_FAULT=kill@POINT) of the dump and
# of the restore, then at timed delays spread over a measured dump and a
# measured restore (evenly spaced fractions plus random offsets). After each
# kill the guardian is waited for (bounded: until it has exited), then:
#   dump killed      every process of the job is alive and answers `verify`
#                    with the bytes and addresses it had; where the dump
#                    had committed first, the job is gone and its images
#                    restore it intact
#   restore killed   the half-built tree is gone and the same images
#                    restore (the last step), or, where the restore had
#                    committed first, the job answers intact
# A process alive that does not answer, or a guardian that said "rollback
# complete" with one of them, fails the test with what the driver and the
# interposer say of it (the window of #45). Every iteration's kill point and
# outcome is one "iteration K: ..." line of the log; KILLED_TABLE=FILE also
# appends "KIND POINT OUTCOME" lines there (killed-soak.sh's table).
# KILLED_FRACTIONS (default 5) and KILLED_RANDOM (default 1) set how many
# timed kills each of the dump and the restore gets.
. "$srcdir/lib.sh"

export CUINTERPOSE_TEST_QUIESCE_RETRIES=0
export MALLOC_ARENA_MAX=1 # see t-faults.sh
N=3
K=0
GEN=1
FRACTIONS=${KILLED_FRACTIONS:-5}
RANDOMS=${KILLED_RANDOM:-1}
TABLE=${KILLED_TABLE:-}
CKPT=$B/test/fakecuda/fakecuda-ckpt
CLI=$B/cli/cuinterpose
GUARD_COMM=criu-cuip-guard

record() { # KIND POINT OUTCOME [DETAIL]
	echo "iteration $K: $1 kill at $2 -> $3${4:+ ($4)}"
	[ -z "$TABLE" ] || echo "$1 $2 $3" >>"$TABLE"
}

# ask VERB [ARGS]: cmd_sent's protocol with its own bound (15 s); 0 when
# every live rank answered, 1 otherwise (missing_answers names who did not).
ask() {
	local i f got

	SEQ=$((SEQ + 1))
	echo "$SEQ $*" >"$T/w/cmd.tmp" && mv "$T/w/cmd.tmp" "$T/w/cmd"
	waiting "the answers of $N ranks to command $SEQ '$*'"
	for ((i = 0; i < 300; i++)); do
		got=0
		for f in "$T"/w/r*."$SEQ"; do [ -e "$f" ] && got=$((got + 1)); done
		[ $got -ge $N ] && { waited; return 0; }
		failed_ranks && fail "'$*': $(cat "$T"/w/*.failed)"
		nap 0.05
	done
	waited
	return 1
}

# stuck_report: what each process of the job is, to the driver (native
# state), the interposer (inspect) and the kernel (thread states)
stuck_report() {
	local p t

	for p in $(job_pids); do
		echo "pid $p: state $(stat_state "$p" | grep . || echo gone)," \
			"native $(timeout 10 "$FAKERUN" "$CKPT" --pid "$p" --action state 2>&1 | tr '\n' ' ')," \
			"tracer $(awk '/TracerPid/ {print $2}' /proc/$p/status 2>/dev/null)"
		for t in /proc/$p/task/*; do
			echo "  tid ${t##*/} $(cat $t/comm 2>/dev/null) $(stat_state "$p/task/${t##*/}")" \
				"wchan $(cat $t/wchan 2>/dev/null)"
		done
		timeout 10 "$CLI" inspect "$p" 2>&1 | head -n 6 | sed 's/^/  inspect: /'
	done
}

# job_intact WHAT: every process alive and answering verify $GEN with the
# addresses of $before; fails with stuck_report otherwise.
job_intact() {
	local p

	for p in $(job_pids); do alive "$p" || fail "$1: pid $p died"; done
	if ! ask verify "$GEN"; then
		fail "$1: a process of the job does not answer ($(missing_answers $N))
guardian: $(grep -h "rollback complete\|ROLLBACK FAILED\|killed" "$2"/cuinterpose-guardian.log 2>/dev/null)
$(stuck_report)"
	fi
	for ((r = 0; r < N; r++)); do
		case "$(head -n1 "$T/w/r$r.$SEQ")" in
		ok*) ;;
		*) fail "$1: rank $r: $(cat "$T/w/r$r.$SEQ")" ;;
		esac
	done
	[ "$(answers $N)" = "$before" ] || fail "$1: answers changed: $(answers $N) vs $before"
}

# crius DIR ACTION: the pids of criu's processes (main, guardian, agent:
# the forks keep its command line) of the criu ACTION with images in DIR
crius() { pgrep -f "criu $2 .*-D $1 " 2>/dev/null; }

# guardian_gone DIR ACTION: wait (60 s at most) until no guardian of that
# criu runs; the guardian _exits when its duty is over (rolled back, tree
# killed, or released by criu). Fails past the bound.
guardian_gone() {
	local i p left

	waiting "the guardian of criu $2 -D $1 to finish"
	for ((i = 0; i < 1200; i++)); do
		left=
		for p in $(crius "$1" "$2"); do
			[ "$(cat /proc/$p/comm 2>/dev/null)" = $GUARD_COMM ] &&
				live "$p" && left="$left $p"
		done
		[ -z "$left" ] && { waited; return 0; }
		nap 0.05
	done
	fail "the guardian(s)$left of criu $2 -D $1 still run after 60 s: $(tail -n 5 "$1/cuinterpose-guardian.log" 2>&1)"
}

verdict() { # DIR: the guardian's last verdict, or none
	local v
	v=$(grep -ho "rollback complete\|ROLLBACK FAILED\|restored tree killed" "$1/cuinterpose-guardian.log" 2>/dev/null | tail -n1)
	echo "${v:-none}"
}

# restart_job WHY: a fresh job at generation $GEN ($before anew)
restart_job() {
	local pids
	note "restarting the job: $1"
	pids=$(job_pids)
	kill -9 $pids 2>/dev/null
	wait_gone $pids
	start_job $N
	cmd $N write 2 $GEN
	cmd $N verify $GEN
	before=$(answers $N)
}

# restore_intact DIR WHAT: restore DIR (the job's pids free) and check it
restore_intact() {
	truncate -s "$(cat "$1/.logsize")" "$T/job.log"
	criu_restore "$1" -o restore-ok.log >"$1/restore-ok.out" 2>&1 || fail "$2: restore of $1"
	JOBPID=$(pid_of 0)
	job_intact "$2 (restored)" "$1"
}

# after_dump_kill KIND POINT DIR: the checks after criu dump -D DIR died.
after_dump_kill() {
	local kind=$1 point=$2 dir=$3 v dead= p

	guardian_gone "$dir" dump
	v=$(verdict "$dir")
	for p in $(job_pids); do live "$p" || dead="$dead $p"; done
	if { [ -n "$dead" ] && grep -q "Dumping finished successfully" "$dir/dump.log"; } ||
		grep -q "guardian: released: commit: the dump succeeded" "$dir/dump.log"; then
		# committed: criu ended the job (or was ending it when killed;
		# killed between the commit and its kill, it left the tasks
		# checkpointed with complete images: they are killed here)
		for p in $(job_pids); do alive "$p" && kill -9 "$p"; done
		wait_gone $(job_pids)
		stat -c %s "$T/job.log" >"$dir/.logsize"
		restore_intact "$dir" "$point (dump committed)"
		record "$kind" "$point" committed-restored "guardian: $v"
		return
	fi
	if [ -n "$dead" ]; then
		# CRIU's parasite was in a task: it dies of SIGTRAP without a
		# tracer (docs/architecture.md, "CRIU's own limit"); nothing else may.
		# The guardian says ROLLBACK FAILED when it finds the task dead
		# already, "rollback complete" when the task dies after it:
		# either is true of what it saw.
		grep -q "parasite\|Dumping path for\|Dumping pages" "$dir/dump.log" ||
			fail "$point: pid(s)$dead died before criu's memory dump: $(tail -n 5 "$dir/dump.log")"
		record "$kind" "$point" died-in-parasite "pid(s)$dead; guardian: $v"
		restart_job "pid(s)$dead died with CRIU's parasite inside"
		return
	fi
	[ "$v" = "ROLLBACK FAILED" ] && fail "$point: the guardian's rollback failed: $(tail -n 8 "$dir/cuinterpose-guardian.log")"
	job_intact "$point" "$dir"
	if [ "$v" = "rollback complete" ]; then
		record "$kind" "$point" rolled-back
	elif grep -q "guardian pid" "$dir/dump.log"; then
		record "$kind" "$point" untouched "guardian released"
	else
		record "$kind" "$point" untouched "no guardian yet"
	fi
}

# after_restore_kill KIND POINT DIR PIDS: the checks after criu restore -D
# DIR died: the tree gone (or, committed, the job intact)
after_restore_kill() {
	local kind=$1 point=$2 dir=$3 v p left=
	shift 3

	guardian_gone "$dir" restore
	v=$(verdict "$dir")
	if grep -q "Restore finished successfully" "$dir/$LOG" && [ "$v" = none ]; then
		JOBPID=$(pid_of 0)
		job_intact "$point (restore committed)" "$dir"
		record "$kind" "$point" committed-running
		# the next kills need the job in images again
		IMG=$T/img$K
		pids=$(job_pids)
		criu_dump "$IMG" >"$T/img$K.out" 2>&1 || fail "dump after a committed restore"
		wait_gone $pids || fail "dumped processes still alive"
		stat -c %s "$T/job.log" >"$IMG/.logsize"
		return
	fi
	wait_gone "$@" || true
	for p in "$@"; do
		live "$p" && left="$left $p"
	done
	[ -z "$left" ] || fail "$point: restored process(es)$left still alive after criu died (guardian: $v)
$(stuck_report)"
	truncate -s "$(cat "$dir/.logsize")" "$T/job.log"
	record "$kind" "$point" tree-gone "guardian: $v"
}

start_job $N
cmd $N write 2 $GEN
cmd $N verify $GEN
before=$(answers $N)

# --- how long a dump and a restore take here --------------------------
note "measure a dump and a restore"
pids=$(job_pids)
t0=${EPOCHREALTIME/./}
criu_dump "$T/m" >"$T/m.out" 2>&1 || fail "measuring dump"
DUMP_US=$((${EPOCHREALTIME/./} - t0))
wait_gone $pids || fail "dumped processes still alive"
stat -c %s "$T/job.log" >"$T/m/.logsize"
t0=${EPOCHREALTIME/./}
criu_restore "$T/m" >"$T/m-restore.out" 2>&1 || fail "measuring restore"
RESTORE_US=$((${EPOCHREALTIME/./} - t0))
JOBPID=$(pid_of 0)
job_intact "measured restore" "$T/m"
echo "a dump takes $((DUMP_US / 1000)) ms, a restore $((RESTORE_US / 1000)) ms"

# --- (a) dump: every fault point ----------------------------------------
for point in discovery begin:HANDSHAKE HANDSHAKE begin:INSPECT INSPECT begin:QUIESCE QUIESCE begin:REINSPECT \
	REINSPECT begin:PREPARE_MULTICAST PREPARE_MULTICAST begin:SAVE SAVE IMAGES begin:PREPARE_UNICAST \
	PREPARE_UNICAST native-lock native-checkpoint memdump; do
	K=$((K + 1))
	note "iteration $K: dump, kill@$point"
	CUINTERPOSE_TEST_FAULT=kill@$point criu_dump "$T/f$K" >"$T/f$K.out" 2>&1 && fail "$point: criu dump succeeded"
	grep -q "fault injection (CUINTERPOSE_TEST_FAULT): kill at $point" "$T/f$K/dump.log" ||
		fail "$point: the fault did not fire: $(grep "cuinterpose: \|Error" "$T/f$K/dump.log" | tail -n 5)"
	after_dump_kill fault "$point" "$T/f$K"
done

# stage DIR LOG: where criu was when it died, for the log: the guardian's
# "last progress" where it acted, else the last landmark of criu's log
stage() {
	local g
	g=$(sed -n 's/.*last progress: \([a-z]* [^;]*\);.*/\1/p' "$1/cuinterpose-guardian.log" 2>/dev/null | tail -n1)
	if [ -n "$g" ]; then
		echo "$g" | tr ' ' '-'
	elif grep -q "finished successfully" "$1/$2" 2>/dev/null; then
		echo finished
	elif grep -q "CHECKPOINT_DEVICES done\|RESUME_DEVICES_LATE" "$1/$2" 2>/dev/null; then
		echo after-devices
	elif grep -q "guardian pid" "$1/$2" 2>/dev/null; then
		echo guarded
	elif grep -q "cuinterpose: " "$1/$2" 2>/dev/null; then
		echo plugin-loaded
	else
		echo before-plugin
	fi
}

# --- (b) dump: timed kills ----------------------------------------------
# kill_criu_after US DIR ACTION: SIGKILL that criu US microseconds after
# T0_US (its start); prints the delay it really had
kill_criu_after() {
	local us=$1 c= i

	for ((i = 0; i < 200; i++)); do
		c=$(criu_main "$2" "$3") && break
		nap 0.005
	done
	[ -n "$c" ] || { echo gone; return; }
	i=$((us - (${EPOCHREALTIME/./} - T0_US)))
	[ $i -gt 0 ] && nap "$(printf '%d.%06d' $((i / 1000000)) $((i % 1000000)))"
	kill -9 "$c" 2>/dev/null || { echo gone; return; }
	echo $(((${EPOCHREALTIME/./} - T0_US) / 1000))
}

delays() { # TOTAL_US: FRACTIONS evenly spaced, then RANDOMS random, in us
	local i
	for ((i = 1; i <= FRACTIONS; i++)); do echo $(($1 * i / (FRACTIONS + 1))); done
	for ((i = 0; i < RANDOMS; i++)); do echo $(((RANDOM * 32768 + RANDOM) % $1)); done
}

for us in $(delays $DUMP_US); do
	K=$((K + 1))
	dir=$T/f$K
	note "iteration $K: dump, SIGKILL at $((us / 1000)) ms of $((DUMP_US / 1000))"
	T0_US=${EPOCHREALTIME/./}
	criu_dump "$dir" >"$T/f$K.out" 2>&1 &
	dumper=$!
	at=$(kill_criu_after "$us" "$dir" dump)
	wait $dumper
	after_dump_kill timed "${at}ms/$((DUMP_US / 1000))ms@$(stage "$dir" dump.log)" "$dir"
done

# --- restore: every fault point, then timed kills -------------------------
note "dump for the restore kills"
IMG=$T/d
pids=$(job_pids)
criu_dump "$IMG" >"$T/d.out" 2>&1 || fail "criu dump"
wait_gone $pids || fail "dumped processes still alive"
stat -c %s "$T/job.log" >"$IMG/.logsize"

for point in restore-init post-forking native-restore begin:LOAD LOAD begin:REBUILD_CREATORS REBUILD_CREATORS \
	begin:REBUILD_IMPORTERS REBUILD_IMPORTERS begin:VERIFY VERIFY begin:RESUME RESUME; do
	K=$((K + 1))
	LOG=restore-$K.log
	note "iteration $K: restore, kill@$point"
	rm -f "$IMG/cuinterpose-guardian.log"
	CUINTERPOSE_TEST_FAULT=kill@$point criu_restore "$IMG" -o $LOG >"$T/r$K.out" 2>&1
	grep -q "fault injection (CUINTERPOSE_TEST_FAULT): kill at $point" "$IMG/$LOG" ||
		fail "restore:$point: the fault did not fire: $(grep "cuinterpose: \|Error" "$IMG/$LOG" | tail -n 5)"
	after_restore_kill fault "restore:$point" "$IMG" $pids
done

for us in $(delays $RESTORE_US); do
	K=$((K + 1))
	LOG=restore-$K.log
	note "iteration $K: restore, SIGKILL at $((us / 1000)) ms of $((RESTORE_US / 1000))"
	rm -f "$IMG/cuinterpose-guardian.log"
	wait_pids_free
	T0_US=${EPOCHREALTIME/./}
	criu_restore "$IMG" -o $LOG >"$T/r$K.out" 2>&1 &
	restorer=$!
	at=$(kill_criu_after "$us" "$IMG" restore)
	wait $restorer
	# criu_restore skipped (exit 77, its SKIP line in the log): the ASan
	# build's known crash of criu's restore child, not a kill's outcome
	[ $? = 77 ] && exit 77
	after_restore_kill timed "restore:${at}ms/$((RESTORE_US / 1000))ms@$(stage "$IMG" "$LOG")" "$IMG" $pids
done

note "restore the same images"
rm -f "$IMG/cuinterpose-guardian.log"
restore_intact "$IMG" "after the killed restores"
[ ! -e "$IMG/cuinterpose-guardian.log" ] || fail "the guardian acted on a committed restore"
echo "$K kills"

# --- the window, reached on purpose ---------------------------------------
# Killed after the native checkpoint, the guardian must native-restore and
# unlock every process before it reopens the gates and reports. Here the
# driver does not answer its state queries for the first process (the
# guardian's agent's first 3 GetState calls fail: FAKECUDA_FAIL_DIR, each
# entry firing on its own first call, read by the fake in the guardian's
# agent only): that process stays checkpointed. The guardian must say
# ROLLBACK FAILED and name it, never "rollback complete" (before the fix it
# logged the unreadable state, skipped the process and went on to the
# participants' rollback and its verdict as if the process ran).
K=$((K + 1))
note "iteration $K: dump, stop@native-checkpoint, the driver mute on GetState in the guardian"
FAKECUDA_FAIL_DIR=$T/faults
mkdir -p "$FAKECUDA_FAIL_DIR"
FAKECUDA_FAIL_DIR=$FAKECUDA_FAIL_DIR CUINTERPOSE_GUARDIAN_STOP_MS=1000 CUINTERPOSE_TEST_FAULT=stop@native-checkpoint \
	criu_dump "$T/f$K" >"$T/f$K.out" 2>&1 &
dumper=$!
wait_line "$T/f$K/dump.log" "stop at native-checkpoint"
arm any "cuCheckpointProcessGetState:1,cuCheckpointProcessGetState:1,cuCheckpointProcessGetState:1"
wait $dumper
guardian_gone "$T/f$K" dump
glog=$T/f$K/cuinterpose-guardian.log
first=$(sed -n "s/.*pid \([0-9]*\): the driver does not say its state.*/\1/p" "$glog" | head -n1)
[ -n "$first" ] || fail "the guardian's GetState did not fail: $(tail -n 8 "$glog")"
grep -q "rollback complete" "$glog" && fail "the guardian reported the rollback complete with pid $first left checkpointed: $(tail -n 8 "$glog")"
grep -q "ROLLBACK FAILED" "$glog" || fail "the guardian did not report its failed rollback: $(tail -n 8 "$glog")"
grep -q "pid $first is natively checkpointed after the rollback's unlock: it cannot run" "$glog" ||
	fail "the guardian did not name pid $first as unable to run: $(tail -n 8 "$glog")"
disarm
record reached "native-checkpoint+GetState-mute" rollback-failed-loudly "pid $first named"
kill -9 $(job_pids)
note done
