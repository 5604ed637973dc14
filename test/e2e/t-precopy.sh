# `cuinterpose precopy PID DIR` copies the carried device memory of a
# running job into DIR; the job goes on (its answers and bytes unchanged,
# it writes after the copy), `cuinterpose show` verifies the copy, and a
# final dump against it (CUINTERPOSE_PARENT) writes only the one 1 MiB
# chunk the job changed since. Both directories are moved elsewhere
# together; the restore reads the rest from the pre-copy by its path
# relative to the dump: every byte, address and the last write are back. Refused: a
# second pre-copy into a directory that holds one (it may be a parent), a
# tree without the interposer, and a pre-copy of a process that is not
# running (phase QUIESCED during a held dump), which changes nothing.
. "$srcdir/lib.sh"

need_holes
CLI=$B/cli/cuinterpose

CUINTERPOSE_LOG=2 start_job 2
cmd 2 verify 0
before=$(answers 2)

note "pre-copy of the running job"
"$CLI" precopy "$JOBPID" "$T/pre" >"$T/pre.out" 2>&1 || fail "precopy: $(cat "$T/pre.out")"
grep -q "^pre-copied [0-9]* bytes of 2 processes (2 participants) into $T/pre" "$T/pre.out" || fail "$(cat "$T/pre.out")"
grep -q "pre-copied (the job running)" "$T/job.log" || fail "no interposer pre-copied while running"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "the job changed under the pre-copy"
"$CLI" show "$T/pre" >"$T/show.txt" 2>&1 || fail "show of the pre-copy: $(cat "$T/show.txt")"
"$CLI" precopy "$JOBPID" "$T/pre" >"$T/pre2.out" 2>&1 && fail "a second pre-copy over the first succeeded"
grep -q "already holds a checkpoint" "$T/pre2.out" || fail "$(cat "$T/pre2.out")"
sleep 60 &
plain=$!
# until it runs sleep: before its exec it is a copy of this shell (a
# pre-copy of that, and a kill with this shell's EXIT trap in it)
comm=
waiting "pid $plain to run sleep"
for _ in $(seq 200); do
	read -r comm <"/proc/$plain/comm" && [ "$comm" = sleep ] && break
	nap 0.05
done
[ "$comm" = sleep ] || fail "pid $plain runs $comm, not sleep, after $(elapsed "$WAIT_US") s"
waited
"$CLI" precopy $plain "$T/nobody" >"$T/pre3.out" 2>&1 && fail "pre-copy of a tree without the interposer succeeded"
kill $plain
grep -q "runs the interposer" "$T/pre3.out" || fail "$(cat "$T/pre3.out")"
[ ! -e "$T/nobody/cuinterpose-inventory.img" ] || fail "a refused pre-copy left an inventory"

cmd 2 write 0 1
cmd 2 verify 1
note "final dump against the pre-copy"
pids=$(job_pids)
CUINTERPOSE_PARENT=$T/pre criu_dump "$T/d" || fail "criu dump: $(tail -5 "$T/d/dump.log")"
wait_gone $pids || fail "dumped processes still alive"
grep -q "SAVE: [0-9]* of [0-9]* carried bytes left to the parent checkpoint $T/pre, 1048576 written" "$T/d/dump.log" ||
	fail "the final dump wrote more than the changed chunk: $(grep 'left to the parent' "$T/d/dump.log")"
note "restore through the pre-copy, both moved elsewhere"
mkdir "$T/moved" && mv "$T/pre" "$T/d" "$T/moved/" || fail "cannot move the images"
"$CLI" show "$T/moved/d" >"$T/showm.txt" 2>&1 || fail "show of the moved chain: $(cat "$T/showm.txt")"
criu_restore "$T/moved/d" || fail "criu restore: $(grep -h Error "$T/moved/d/restore.log" | tail -3)"
cmd 2 verify 1
[ "$(answers 2)" = "$before" ] || fail "answers differ after the restore: $(answers 2) vs $before"

note "a process that is not running is not pre-copied"
CUINTERPOSE_GUARDIAN_STOP_MS=60000 CUINTERPOSE_TEST_FAULT=stop@SAVE criu_dump "$T/held" --leave-running >"$T/held.out" 2>&1 &
held=$!
for _ in $(seq 1200); do
	grep -q "fault injection (CUINTERPOSE_TEST_FAULT): stop at SAVE" "$T/held/dump.log" 2>/dev/null && break
	alive $held || fail "the held dump ended: $(tail -3 "$T/held.out")"
	nap 0.05
done
grep -q "fault injection (CUINTERPOSE_TEST_FAULT): stop at SAVE" "$T/held/dump.log" || fail "criu did not stop at SAVE"
"$CLI" precopy "$JOBPID" "$T/pre4" >"$T/pre4.out" 2>&1 && fail "pre-copy of a quiesced job succeeded"
grep -q "pre-copy in phase QUIESCED (only a running job is pre-copied)" "$T/pre4.out" || fail "$(cat "$T/pre4.out")"
[ ! -e "$T/pre4/cuinterpose-inventory.img" ] || fail "a refused pre-copy left an inventory"
killed=0
for p in $(pgrep -x criu); do
	grep -qa "$T/held" /proc/$p/cmdline 2>/dev/null && kill -KILL $p && killed=1
done
[ $killed = 1 ] || fail "no stopped criu to kill"
wait $held && fail "the held dump succeeded"
guardian_done "$T/held"
cmd 2 verify 1
[ "$(answers 2)" = "$before" ] || fail "answers differ after the rollback: $(answers 2) vs $before"
cmd 2 exit
note done
