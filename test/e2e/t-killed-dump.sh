# criu killed part-way through a dump (#21): at every phase boundary
# (CUINTERPOSE_TEST_FAULT=kill@POINT), SIGSTOPped beyond the guardian's bound,
# and with its guardian or native agent killed. Each time the job answers
# with every byte, address and sharing intact, no FD or mapping leaked, the
# guardian's log next to the images and the job's stderr say what happened,
# and the next dump still works. One job serves every kill point.
. "$srcdir/lib.sh"

export CUINTERPOSE_TEST_QUIESCE_RETRIES=0
export MALLOC_ARENA_MAX=1 # see t-faults.sh
N=3
K=0

export CENSUS_DEVMEM=1 # lib.sh census: FDs, mappings and device memory

# killed POINT [ACTION]: criu dies at POINT; the guardian rolls back.
killed() {
	K=$((K + 1))
	note "kill $K: ${2:-kill}@$1"
	if CUINTERPOSE_TEST_FAULT=${2:-kill}@$1 criu_dump "$T/f$K" >"$T/f$K.out" 2>&1; then
		fail "$1: criu dump succeeded"
	fi
	grep -q "fault injection (CUINTERPOSE_TEST_FAULT): ${2:-kill} at $1" "$T/f$K/dump.log" ||
		fail "$1: the fault did not fire"
	guardian_done "$T/f$K"
	intact "kill at $1"
}

start_reference 1

for point in discovery begin:QUIESCE QUIESCE PREPARE_MULTICAST SAVE IMAGES begin:PREPARE_UNICAST PREPARE_UNICAST \
	native-lock native-checkpoint; do
	killed $point
done
# criu died with PREPARE_UNICAST begun but sent to nobody: the guardian
# believes what the participants say (QUIESCED, memory attached).
grep -q "is QUIESCED with its unicast memory attached: PREPARE_UNICAST never reached it" "$T/f7/dump.log" ||
	fail "begin:PREPARE_UNICAST: the guardian did not reconcile its flags"
grep -q "criu went away in the middle of a checkpoint" "$T/job.log" || fail "nothing in the job's stderr"
grep -q "the checkpoint's control connection was lost in phase QUIESCED (criu killed or crashed?)" "$T/job.log" ||
	fail "the job's stderr does not say its checkpoint connection was lost"

# --leave-running: criu dies during its own in-place restore (the commit
# point is its end); the guardian redoes it from where it stood.
for point in LOAD REBUILD_CREATORS REBUILD_IMPORTERS VERIFY; do
	K=$((K + 1))
	note "kill $K: kill@$point of the in-place restore (--leave-running)"
	CUINTERPOSE_TEST_FAULT=kill@$point criu_dump "$T/f$K" --leave-running >"$T/f$K.out" 2>&1 &&
		fail "$point (--leave-running): criu dump succeeded"
	guardian_done "$T/f$K"
	intact "kill at $point of the in-place restore"
done
grep -q "is RESTORING: a rebuild was under way; redoing it from REBUILD" "$T/f$((K - 3))/dump.log" ||
	fail "in-place LOAD: the guardian did not see the rebuild under way"

# criu stopped beyond the bound: the guardian kills it and rolls back.
K=$((K + 1))
note "kill $K: stop@SAVE, bound 1500 ms"
if CUINTERPOSE_GUARDIAN_STOP_MS=1500 CUINTERPOSE_TEST_FAULT=stop@SAVE criu_dump "$T/f$K" >"$T/f$K.out" 2>&1; then
	fail "stopped criu: dump succeeded"
fi
# (the shell's wait returns when criu stops; the guardian's log says the rest)
guardian_done "$T/f$K"
grep -q "has been stopped for 1500 ms" "$T/f$K/cuinterpose-guardian.log" || fail "stopped criu: not killed by the bound"
intact "criu stopped beyond the bound"

# The guardian killed: criu does not go on without it, and rolls back itself.
K=$((K + 1))
note "kill $K: kill-guardian@QUIESCE"
if CUINTERPOSE_TEST_FAULT=kill-guardian@QUIESCE criu_dump "$T/f$K" >"$T/f$K.out" 2>&1; then
	fail "dump without a guardian succeeded"
fi
grep -q "is gone: refusing to go on with REINSPECT without it" "$T/f$K/dump.log" ||
	fail "no refusal after the guardian died: $(grep cuinterpose "$T/f$K/dump.log" | tail -15)"
grep -q "rollback complete" "$T/f$K/dump.log" || fail "criu did not roll back after the guardian died"
intact "guardian killed"

# The native agent killed before the lock and before the checkpoint.
for point in PREPARE_UNICAST native-lock; do
	K=$((K + 1))
	note "kill $K: kill-agent@$point"
	if CUINTERPOSE_TEST_FAULT=kill-agent@$point criu_dump "$T/f$K" >"$T/f$K.out" 2>&1; then
		fail "agent killed at $point: dump succeeded"
	fi
	grep -q "native agent\|agent died\|killed by signal 9" "$T/f$K/dump.log" ||
		fail "agent killed at $point: no message: $(grep cuinterpose "$T/f$K/dump.log" | tail -15)"
	grep -q "rollback complete\|in-place restore complete" "$T/f$K/dump.log" ||
		fail "agent killed at $point: no rollback: $(grep cuinterpose "$T/f$K/dump.log" | tail -15)"
	intact "agent killed at $point"
done

# second_dump_refused POINT WHAT REFUSAL: a second dump while the first is
# held at POINT (stopped, no bound) is refused, its log says REFUSAL, and it
# leaves the first alone, which then completes.
second_dump_refused() {
	local point=$1 what=$2 refusal=$3 first p

	K=$((K + 1))
	note "kill $K: a second dump during $what"
	CUINTERPOSE_GUARDIAN_STOP_MS=0 CUINTERPOSE_TEST_FAULT=stop@$point criu_dump "$T/f$K" --leave-running \
		>"$T/f$K.out" 2>&1 &
	first=$!
	wait_line "$T/f$K/dump.log" "stop at $point" # the first dump reached it
	if criu_dump "$T/second$K" >"$T/second$K.out" 2>&1; then
		fail "a second dump during $what succeeded"
	fi
	grep -h "$refusal" "$T/second$K/dump.log" | head -1 | grep . ||
		fail "the second dump during $what was not refused clearly: $(grep cuinterpose "$T/second$K/dump.log" | tail -5)"
	for p in $(pgrep -f "criu dump -t $JOBPID -D $T/f$K"); do kill -CONT "$p"; done
	wait $first || fail "the first dump did not complete after the second was refused: $(tail -5 "$T/f$K/dump.log")"
	grep -q "in-place restore complete" "$T/f$K/dump.log" || fail "first dump ($what): no in-place restore"
	intact "second dump refused during $what"
}

second_dump_refused PREPARE_UNICAST "the first" "another checkpoint or restore of it is in progress"
# The same while the first holds the processes natively locked: refused at
# discovery, by the driver's state.
second_dump_refused native-lock "the first's native lock" "is natively locked: another checkpoint of it is in progress"

# After all that, a real dump and restore.
GEN=1
cmd $N write 2 $GEN
cmd $N verify $GEN
pids=$(job_pids)
note "dump"
criu_dump "$T/d" || fail "criu dump after the kills"
wait_gone $pids || fail "dumped processes still alive"
[ ! -e "$T/d/cuinterpose-guardian.log" ] || fail "the guardian acted on a committed dump: $(cat "$T/d/cuinterpose-guardian.log")"
note "restore"
criu_restore "$T/d" || fail "criu restore after the kills"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed after restore"

# Last, criu killed during its own memory dump. CRIU's parasite code may be
# running inside a task then; a task left running parasite code with no
# tracer dies of SIGTRAP, whatever any plugin does (CRIU's own behaviour,
# README "When criu dies part-way"). The guardian must still finish its
# rollback; every survivor must be intact when no task died.
K=$((K + 1))
note "kill $K: kill@memdump"
if CUINTERPOSE_TEST_FAULT=kill@memdump criu_dump "$T/f$K" >"$T/f$K.out" 2>&1; then
	fail "memdump: criu dump succeeded"
fi
grep -q "fault injection (CUINTERPOSE_TEST_FAULT): kill at memdump" "$T/f$K/dump.log" || fail "memdump: the fault did not fire"
guardian_done "$T/f$K"
dead=
for p in $(job_pids); do alive $p || dead="$dead $p"; done
if [ -z "$dead" ]; then
	cmd $N verify $GEN
	[ "$(answers $N)" = "$before" ] || fail "kill at memdump: addresses changed"
else
	note "kill at memdump: pid(s)$dead died with CRIU's parasite inside (CRIU's limit, not the plugin's)"
fi

note done
if [ -z "$dead" ]; then cmd $N exit; fi
note done
