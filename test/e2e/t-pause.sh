# The job's pause as two numbers (issue #46): at the end of a dump the
# plugin logs one line in dump.log,
#   cuinterpose: pause: CUDA calls held H s, threads frozen F s[; why]
# and `cuinterpose checkpoint` prints the same line after criu's summary,
# just before its verdict. No timed assertion: only what does not depend
# on the machine's speed.
# - a checkpoint that ends the job (through the front end): one line, in
#   that format, both numbers > 0 (the SAVE is paced to ~0.5 s), "the job
#   ends with the dump", and held >= frozen: both end at that line, and the
#   gates close (QUIESCE) inside PAUSE_DEVICES, before criu seizes the
#   tree; the line comes after the PAUSE_DEVICES and CHECKPOINT_DEVICES
#   lines in dump.log, and in the front end's output after its summary and
#   before "criu succeeded"; the restore logs no pause line;
# - a --leave-running dump: the line says the CUDA calls ran again (the
#   rollback's RESUME) before the dump ended, and the job goes on.
. "$srcdir/lib.sh"

CLI=$B/cli/cuinterpose
[ -x "$CLI" ] || skip "cuinterpose not built ($CLI)"
export FAKECUDA_COPY_US_PER_MB=15000

CRIU_RUN=$CRIU
if [ -n "$SAN_CRIU" ]; then
	CRIU_RUN=$T/criu
	printf '#!/bin/sh\nexec %s %s "$@"\n' "$SAN_CRIU" "$CRIU" >"$CRIU_RUN" && chmod +x "$CRIU_RUN"
fi

LINE='^cuinterpose: pause: CUDA calls held ([0-9]+\.[0-9]{2}) s, threads frozen ([0-9]+\.[0-9]{2}) s'

# pause_of FILE: "HELD FROZEN REST" of the one pause line in FILE
pause_of() {
	local n

	n=$(grep -c "cuinterpose: pause: " "$1")
	[ "$n" = 1 ] || fail "$n pause lines in $1: $(grep "cuinterpose: pause" "$1")"
	grep -Eo "cuinterpose: pause: .*" "$1" | sed -E "s/$LINE(.*)$/\\1 \\2 \\3/;t;s/.*/BAD/"
}

# positive NUMBER: > 0
positive() { awk -v v="$1" 'BEGIN { exit !(v > 0) }'; }

# line_no FILE PATTERN: the number of the first line matching PATTERN
line_no() { grep -n -m1 -E "$2" "$1" | cut -d: -f1; }

start_job 2
cmd 2 verify 0
before=$(answers 2)
pids=$(job_pids)

note "checkpoint through the front end"
"$BOUNDED" $((CRIU_LIMIT_S + 30)) "$FAKERUN" "$CLI" checkpoint --libdir "$T/plugins" --criu "$CRIU_RUN" \
	--timeout "$CRIU_LIMIT_S" "$JOBPID" "$T/d1" </dev/null >"$T/out" 2>"$T/err"
rc=$?
cat "$T/err" >>"$T/front.log"
[ $rc = 0 ] || fail "cuinterpose checkpoint: exit $rc: $(tail -15 "$T/err")"
read -r held frozen rest <<<"$(pause_of "$T/d1/dump.log")"
[ "$held" != BAD ] || fail "pause line in the wrong format: $(grep "cuinterpose: pause" "$T/d1/dump.log")"
positive "$held" || fail "CUDA calls held $held s"
positive "$frozen" || fail "threads frozen $frozen s"
awk -v h="$held" -v f="$frozen" 'BEGIN { exit !(h >= f) }' ||
	fail "a dump that ends the job held CUDA calls $held s, less than the $frozen s its threads were frozen"
[ "$rest" = "; the job ends with the dump" ] || fail "pause line ends '$rest'"
pl=$(line_no "$T/d1/dump.log" "cuinterpose: pause: ")
for l in "cuinterpose: PAUSE_DEVICES done" "cuinterpose: CHECKPOINT_DEVICES done" "cuinterpose: SAVE: 2 participants"; do
	n=$(line_no "$T/d1/dump.log" "$l")
	[ -n "$n" ] && [ "$n" -lt "$pl" ] || fail "'$l' (line ${n:-none}) not before the pause line ($pl) in dump.log"
done
# the front end: the same line, after the summary, just before the verdict
log_line=$(grep -Eo "cuinterpose: pause: .*" "$T/d1/dump.log")
grep -qxF "$log_line" "$T/err" || fail "the front end did not print '$log_line': $(tail -8 "$T/err")"
[ "$(tail -2 "$T/err" | head -1)" = "$log_line" ] || fail "the pause line is not last before the verdict: $(tail -4 "$T/err")"
grep -q "^cuinterpose checkpoint: criu succeeded" "$T/err" || fail "no verdict: $(tail -4 "$T/err")"
[ "$(line_no "$T/err" "^cuinterpose: PAUSE_DEVICES done")" -lt "$(line_no "$T/err" "^cuinterpose: pause: ")" ] ||
	fail "the pause line comes before the summary: $(cat "$T/err")"
wait_gone $pids || fail "dumped processes still alive"

note "restore"
criu_restore "$T/d1" || fail "criu restore"
grep -q "cuinterpose: pause: " "$T/d1/restore.log" && fail "a pause line in restore.log"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "addresses changed"

note "dump --leave-running"
criu_dump "$T/d2" --leave-running || fail "criu dump --leave-running"
read -r held frozen rest <<<"$(pause_of "$T/d2/dump.log")"
[ "$held" != BAD ] || fail "pause line in the wrong format: $(grep "cuinterpose: pause" "$T/d2/dump.log")"
positive "$held" && positive "$frozen" || fail "held $held s, frozen $frozen s"
[ "$rest" = "; CUDA calls ran again before the dump ended" ] || fail "--leave-running: pause line ends '$rest'"
for p in $(job_pids); do alive $p || fail "pid $p died"; done
cmd 2 verify 0
cmd 2 exit
note done
