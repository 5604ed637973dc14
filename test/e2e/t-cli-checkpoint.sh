# `cuinterpose checkpoint PID DIR` and `cuinterpose restore DIR`, the front
# end over plain criu:
# - a pid that does not exist is refused before criu runs (exit 1), no DIR
#   is left behind; so is a job whose session is led from outside its pid
#   namespace (criu cannot dump it);
# - a job started from the shell (not its session's leader) holding an
#   unlinked /dev/shm file (a semaphore, as multiprocessing makes) gets
#   --shell-job and --link-remap picked, each with its reason, and
#   checkpoints and restores (restore: --shell-job read from the images);
# - on a job of three processes sharing memory, which leads its session: a
#   dump refused by the plugin (an importer outside the tree) exits with
#   criu's status (1) and prints the refusal line, criu's errors and the
#   log's path; two checkpoint/restore cycles keep every pid, address and
#   byte, the printed criu command holding the flags picked (-L for a
#   plugin directory that is not criu's default, --restore-detached
#   --pidfile, -v4 -o) and no --shell-job;
# - on a terminal (script's pty) one status line is rewritten with the
#   plugin's phase, bytes and rate; with stderr not a terminal, none;
# - a criu that hangs (stopped at SAVE) is killed past --timeout, exit 124,
#   the message names the log, and the guardian rolls the job back;
# - restore --reap becomes the restored root's parent and reaps the job
#   when it exits.
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

CLI=$B/cli/cuinterpose
THIEF=$B/test/e2e/e2e_thief
[ -x "$CLI" ] || skip "cuinterpose not built ($CLI)"
[ -x "$THIEF" ] || skip "e2e_thief not built"
command -v script >/dev/null || skip "script (util-linux) not installed"
N=3
# ~65 MB/s host<->device copies: SAVE and LOAD of the job's 36 MiB take
# about half a second, long enough for progress lines.
export FAKECUDA_COPY_US_PER_MB=15000
HOLDER=
REAPER=
R0=
cleanup_all() {
	[ -n "$HOLDER" ] && kill -9 "$HOLDER" 2>/dev/null
	[ -n "$REAPER" ] && kill -9 "$REAPER" 2>/dev/null
	[ -n "$R0" ] && rm -f "/dev/shm/sem.cuip-e2e-$R0"
}
at_exit cleanup_all

# criu as the front end runs it: sanitizer builds preload the runtime into
# criu alone (lib.sh's SAN_CRIU), through a wrapper given as --criu.
CRIU_RUN=$CRIU
if [ -n "$SAN_CRIU" ]; then
	CRIU_RUN=$T/criu
	printf '#!/bin/sh\nexec %s %s "$@"\n' "$SAN_CRIU" "$CRIU" >"$CRIU_RUN" && chmod +x "$CRIU_RUN"
fi

# front COMMAND ARGS...: the front end under the fake driver, plugin from
# $T/plugins, stdout in $T/out, stderr in $T/err, exit status in $rc. It
# bounds criu itself (--timeout); bounded is the backstop. FRONT_PREFIX
# (e.g. setsid) goes before it all.
front() {
	${FRONT_PREFIX:-} "$BOUNDED" $((CRIU_LIMIT_S + 30)) "$FAKERUN" "$CLI" "$1" --libdir "$T/plugins" --criu "$CRIU_RUN" \
		--timeout "$CRIU_LIMIT_S" "${@:2}" </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	{ echo "=== cuinterpose $* (exit $rc)"; cat "$T/err"; } >>"$T/front.log"
}

# cmdline FILE COMMAND: the criu command line the front end printed.
cmdline() {
	grep -a -m1 "^cuinterpose $2: running: " "$1" | tr -d '\r' ||
		fail "no criu command line in $1: $(cat "$1")"
}

# flags LINE WANTED UNWANTED: every WANTED piece (space-separated; a comma
# stands for a space inside a piece) is in the command line, no UNWANTED
# flag is.
flags() {
	local w

	for w in $2; do
		case "$1 " in *" ${w//,/ } "*) ;; *) fail "'${w//,/ }' missing from: $1" ;; esac
	done
	for w in $3; do
		case "$1 " in *" $w "*) fail "'$w' in: $1" ;; esac
	done
}

# no_status FILE: no status line (stderr was not a terminal).
no_status() {
	grep -q $'\r' "$1" && fail "carriage return in $1 although stderr is not a terminal"
	grep -Eq "\[(checkpoint|restore) [0-9]+\.[0-9] s\]" "$1" && fail "a status line in $1"
	return 0
}

# asan_restore_skip DIR: sanitizer builds: criu's restore child crashes on
# processes restored before (see lib.sh, criu_restore); skip then.
asan_restore_skip() {
	[ -n "${CUIP_ASAN_RT:-}" ] && grep -q "killed by signal 11" "$1/restore.log" &&
		skip "ASan build: criu's restore child crashes (SIGSEGV) restoring an ASan process"
	return 0
}

restore_ok() { # DIR: restore it with the front end, check the pid it prints
	wait_pids_free
	front restore "$@"
	[ $rc = 0 ] || asan_restore_skip "$1"
	[ $rc = 0 ] || fail "cuinterpose restore $1: exit $rc: $(tail -15 "$T/err")"
	[ "$(cat "$T/out")" = "$JOBPID" ] || fail "restore printed '$(cat "$T/out")', not the root $JOBPID"
}

note "a pid that does not exist"
front checkpoint 999999 "$T/dx"
[ $rc = 1 ] || fail "checkpoint of no process: exit $rc"
grep -q "^cuinterpose checkpoint: no such process: 999999$" "$T/err" || fail "no refusal: $(cat "$T/err")"
[ -e "$T/dx" ] && fail "the refused checkpoint made its directory"

note "a job whose session leader is outside its pid namespace"
# unshare's shell is the new namespace's init; its session (this test's)
# is led from outside, so getsid() of its child answers 0 in there
"$BOUNDED" 60 unshare --pid --mount --fork --mount-proc sh -c \
	'sleep 60 & "$1" checkpoint --libdir "$2" --criu "$3" $! "$4" 2>"$5"; echo "rc=$?" >"$6"; kill $!' \
	sh "$CLI" "$T/plugins" "$CRIU_RUN" "$T/dn" "$T/err" "$T/out" </dev/null || fail "unshare --pid failed"
[ "$(cat "$T/out")" = rc=1 ] || fail "checkpoint of a session led from outside: $(cat "$T/out"): $(cat "$T/err")"
grep -q "^cuinterpose checkpoint: pid 2's session leader is outside this pid namespace: criu cannot dump" "$T/err" ||
	fail "no refusal: $(cat "$T/err")"
[ -e "$T/dn" ] && fail "the refused checkpoint made its directory"

note "a shell's job holding an unlinked /dev/shm file"
ls /dev/shm/link_remap.* >/dev/null 2>&1 &&
	skip "/dev/shm holds link_remap files this test did not make ($(ls /dev/shm/link_remap.* | head -3 | tr '\n' ' '))"
# The job is a child of a shell that leads its own session, as one started
# from a shell: not the session's leader. (This test's own session may be
# led from outside the pid namespace, as under some CI runners: criu could
# dump no job of it.) The restore gets a session of its own too.
setsid sh -c 'env LD_PRELOAD="$1" CUINTERPOSE_LOG=2 "$2" "$3" "$4" --sem & wait' sh "$SAN_PRELOAD$INTERPOSER" \
	"$FAKERUN" "$PROCWL" "$T/w" </dev/null >"$T/job.log" 2>&1 &
JOB=$!
wait_ready 3
R0=$(rank_pid 0)
grep -q "/dev/shm/.* (deleted)" /proc/"$R0"/maps || skip "this libc's sem_open leaves no unlinked /dev/shm mapping"
cmd 3 verify 0
pids=$(job_pids)
front checkpoint "$JOBPID" "$T/d3"
[ $rc = 0 ] || fail "cuinterpose checkpoint of the semaphore job: exit $rc: $(tail -15 "$T/err")"
line=$(cmdline "$T/err" checkpoint)
flags "$line" "dump,-t,$JOBPID -D,$T/d3 -L,$T/plugins --shell-job --link-remap -v4 -o,dump.log" ""
grep -q "^cuinterpose checkpoint: --link-remap: pid $R0 (e2e_proc) maps or holds 1 unlinked /dev/shm file(s) (/dev/shm/" \
	"$T/err" || fail "no reason given for --link-remap: $(cat "$T/err")"
grep -q "^cuinterpose checkpoint: --shell-job: pid $JOBPID's session leader" "$T/err" ||
	fail "no reason given for --shell-job: $(cat "$T/err")"
grep -q "criu dump needs --link-remap" "$T/d3/dump.log" && fail "the plugin still asks for --link-remap"
links=$(ls /dev/shm/link_remap.* 2>/dev/null)
[ -n "$links" ] || fail "criu made no link remap"
wait_gone $pids || fail "dumped processes still alive"
wait_pids_free
FRONT_PREFIX=setsid front restore "$T/d3"
if [ $rc != 0 ] && [ -n "${CUIP_ASAN_RT:-}" ] && grep -q "killed by signal 11" "$T/d3/restore.log"; then
	# lib.sh, criu_restore: seen on first restores of this job's shape
	note "ASan build: criu's restore child crashed (SIGSEGV); this job's restore is not checked"
	rm -f $links
else
	[ $rc = 0 ] || fail "cuinterpose restore of the semaphore job: exit $rc: $(tail -15 "$T/err")"
	[ "$(cat "$T/out")" = "$JOBPID" ] || fail "restore printed '$(cat "$T/out")', not the root $JOBPID"
	flags "$(cmdline "$T/err" restore)" "--shell-job --restore-detached" "--link-remap"
	ls /dev/shm/link_remap.* >/dev/null 2>&1 && fail "the restore left its link remap in /dev/shm"
	cmd 3 write 0 2
	cmd 3 verify 2
	cmd 3 exit
	wait_gone $pids || fail "the semaphore job did not exit"
fi

start_job $N
creator=$JOBPID
GEN=0
cmd $N verify $GEN
before=$(answers $N)

note "refused by the plugin: an importer outside the tree"
r1=$(pid_of 1)
tfd=$(ls -l /proc/"$r1"/fd | awk '/memfd:cuinterpose-ticket/ {print $9; exit}')
[ -n "$tfd" ] || fail "rank 1 (pid $r1) holds no ticket"
cat /proc/"$r1"/fd/"$tfd" >"$T/ticket"
LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$THIEF" hold "$T/ticket" </dev/null >"$T/holder.out" 2>"$T/holder.log" &
HOLDER=$!
for _ in $(seq 400); do
	grep -q "^import: " "$T/holder.out" || ! alive $HOLDER && break
	nap 0.05
done
grep -q "^import: CUDA_SUCCESS pid $HOLDER$" "$T/holder.out" || fail "the outside importer: $(cat "$T"/holder.*)"
front checkpoint "$JOBPID" "$T/d0"
[ $rc = 1 ] || fail "refused checkpoint: exit $rc, not criu's 1: $(tail -15 "$T/err")"
grep -Eq "^cuinterpose: .*pid $creator allocation [0-9a-f]+:[0-9]+ is imported by pid $HOLDER .*outside the dumped tree" \
	"$T/err" || fail "the refusal line is not printed: $(cat "$T/err")"
grep -q "^cuinterpose checkpoint: criu failed (exit status 1); its log: $T/d0/dump.log$" "$T/err" ||
	fail "no failure line naming the log: $(tail -5 "$T/err")"
grep -q "Error (" "$T/err" || fail "criu's last errors are not printed: $(tail -15 "$T/err")"
no_status "$T/err"
for p in $(job_pids); do alive $p || fail "pid $p died after the refusal"; done
cmd $N verify $GEN
kill $HOLDER
wait $HOLDER 2>/dev/null
HOLDER=

note "cycle 1: checkpoint on a terminal"
pids=$(job_pids)
CUINTERPOSE_PROGRESS_MS=100 script -qec "$(printf '%q ' "$BOUNDED" $((CRIU_LIMIT_S + 30)) "$FAKERUN" "$CLI" \
	checkpoint --libdir "$T/plugins" --criu "$CRIU_RUN" "$JOBPID" "$T/d1")" /dev/null </dev/null >"$T/tty.out"
rc=$?
[ $rc = 0 ] || fail "cuinterpose checkpoint under a pty: exit $rc: $(tr '\r' '\n' <"$T/tty.out" | tail -15)"
line=$(cmdline "$T/tty.out" checkpoint)
flags "$line" "dump,-t,$JOBPID -D,$T/d1 -L,$T/plugins -v4 -o,dump.log" "--shell-job --link-remap"
grep -aEq $'\r\\[checkpoint [0-9]+\\.[0-9] s\\] SAVE [0-9.]+ [KMG]iB of [0-9.]+ MiB \\([0-9]+%\\), [0-9.]+ [MG]B/s' \
	"$T/tty.out" || fail "no SAVE status line on the terminal: $(od -c "$T/tty.out" | head -30)"
grep -aq "^cuinterpose: SAVE: $N participants, " "$T/tty.out" || fail "no SAVE summary: $(tr '\r' '\n' <"$T/tty.out")"
wait_gone $pids || fail "dumped processes still alive"

note "cycle 1: restore"
restore_ok "$T/d1"
line=$(cmdline "$T/err" restore)
flags "$line" "restore,-D,$T/d1 -L,$T/plugins --restore-detached --pidfile,$T/d1/restored.pid -v4 -o,restore.log" \
	"--shell-job"
grep -q "^cuinterpose: RESUME_DEVICES_LATE done: $N participants rebuilt" "$T/err" || fail "no restore summary"
no_status "$T/err"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed: $(answers $N) vs $before"
writes_reach_everyone

note "a criu that hangs is killed past --timeout"
# Bounded by the --timeout under test, with timeout(1) as the backstop (its
# 124 would come after 60 s: the time tells them apart).
t0=$(now_ms)
CUINTERPOSE_GUARDIAN_STOP_MS=0 CUINTERPOSE_TEST_FAULT=stop@SAVE timeout -k 5 60 "$FAKERUN" "$CLI" checkpoint \
	--libdir "$T/plugins" --criu "$CRIU_RUN" --timeout 3 "$JOBPID" "$T/dh" -- --leave-running \
	</dev/null >"$T/out" 2>"$T/err"
rc=$?
cat "$T/err" >>"$T/front.log"
[ $rc = 124 ] && [ $(($(now_ms) - t0)) -lt 30000 ] ||
	fail "hung criu: exit $rc after $(($(now_ms) - t0)) ms, not 124 within 30 s: $(tail -5 "$T/err")"
grep -q "^cuinterpose checkpoint: criu did not finish within 3 s and was killed: it hung; its log: $T/dh/dump.log$" \
	"$T/err" || fail "no hang message naming the log: $(tail -5 "$T/err")"
guardian_done "$T/dh"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed after the rollback: $(answers $N) vs $before"

note "cycle 2: checkpoint, restore --reap"
pids=$(job_pids)
front checkpoint "$JOBPID" "$T/d2"
[ $rc = 0 ] || fail "cuinterpose checkpoint (cycle 2): exit $rc: $(tail -15 "$T/err")"
no_status "$T/err"
grep -q "^cuinterpose: PAUSE_DEVICES done: $N participants" "$T/err" || fail "no PAUSE_DEVICES summary"
wait_gone $pids || fail "dumped processes still alive"
wait_pids_free
"$BOUNDED" $((CRIU_LIMIT_S + 30)) "$FAKERUN" "$CLI" restore --reap --libdir "$T/plugins" --criu "$CRIU_RUN" \
	"$T/d2" </dev/null >"$T/out2" 2>"$T/err2" &
REAPER=$!
for _ in $(seq 2400); do
	[ -s "$T/out2" ] || ! alive $REAPER && break
	nap 0.05
done
if ! [ -s "$T/out2" ]; then
	wait $REAPER
	rc=$?
	REAPER=
	asan_restore_skip "$T/d2"
	fail "cuinterpose restore --reap: exit $rc: $(tail -15 "$T/err2")"
fi
[ "$(cat "$T/out2")" = "$JOBPID" ] || fail "restore --reap printed '$(cat "$T/out2")', not $JOBPID"
parent=$(awk '{print $4}' /proc/"$JOBPID"/stat)
tr '\0' ' ' </proc/"$parent"/cmdline | grep -q "cuinterpose restore --reap" ||
	fail "the restored root's parent is $parent ($(tr '\0' ' ' </proc/"$parent"/cmdline)), not the front end"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed: $(answers $N) vs $before"
writes_reach_everyone
cmd $N exit
wait $REAPER
rc=$?
REAPER=
[ $rc = 0 ] || fail "restore --reap: exit $rc after the job ended: $(tail -5 "$T/err2")"
grep -q "^cuinterpose restore: restored pid $JOBPID exited with status 0$" "$T/err2" ||
	fail "the reaper did not see the root exit: $(tail -5 "$T/err2")"

note done
