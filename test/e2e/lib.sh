# lib.sh - shared helpers of the CRIU end-to-end tests (sourced by t-*.sh).
#
# Each test gets its own directory ($T), fake device daemon socket, interposer
# socket directory and CRIU plugin directory (holding only our plugin), runs
# the job from e2e_group under the fake driver, and cleans up everything it
# started. Exit 77 (skip) when root, criu or the built pieces are missing.
# In sanitizer builds criu runs with the sanitizer runtime preloaded.

set -u

# --- the failure report (every e2e and container test) -------------------
# A test that fails prints, once, what a person needs to see why: the step
# it was in (the last `note`), how long it had been in it and what it was
# waiting for, criu's last logs (their errors and warnings, the plugin's
# lines and their last lines), the guardian's log, the job's logs and the
# test's command outputs, all bounded. Every way out goes through it: fail()
# (also from a helper run in a command substitution or a background
# subshell: it reports, then tells the test shell, which exits 1), an
# unexpected non-zero exit (a shell error, an exit from a helper) and, for a
# test (t-*.sh; the benchmarks source this file too), an exit 0 before its
# last step (`note done`). A test that failed never
# exits 0. Tests add their own cleanup with at_exit, not with a trap of
# their own; container tests redefine cleanup().
# LIB_REPORT_ONLY=1: only this part (tests that set up their own $T).

TEST_NAME=${0##*/}
MAINPID=$BASHPID
skip() { echo "SKIP: $*"; exit 77; }
exec 9>&1 # the test's log, for messages from functions whose output a caller redirects
START_US=${EPOCHREALTIME/./}
# seconds since START_US, or since $1 (microseconds), without a process
elapsed() {
	local d=$((${EPOCHREALTIME/./} - ${1:-$START_US}))
	printf '%d.%d' $((d / 1000000)) $((d % 1000000 / 100000))
}
LAST_NOTE="(before the first step)"
NOTE_US=$START_US
DONE=
note() {
	LAST_NOTE=$*
	NOTE_US=${EPOCHREALTIME/./}
	case "$*" in done | "done:"*) DONE=1 ;; esac
	echo "--- $* ($(elapsed)s)"
}
# waiting WHAT: the test now waits for WHAT (the report names it and how
# long it waited); waited: it came.
WAIT_WHAT=
waiting() {
	WAIT_WHAT=$*
	WAIT_US=${EPOCHREALTIME/./}
}
waited() { WAIT_WHAT=; }

# The report goes to the test's log (fd 9), whatever the caller redirects.
fail() {
	FAILED=1
	FAIL_WHY=$*
	{
		echo "FAIL: $*"
		report
	} >&9 2>&1
	# a helper in a subshell: the test shell ends too (its USR1 trap)
	[ "$BASHPID" = "$MAINPID" ] || kill -USR1 "$MAINPID" 2>/dev/null
	exit 1
}
trap 'FAILED=1; REPORTED=1; exit 1' USR1

# newest FIND-ARGS...: the files under $T that match, newest first (8 at
# most, 4 levels deep: container tests keep image trees there).
newest() {
	timeout 20 find "$T" -maxdepth 4 -type f \( "$@" \) -printf '%T@ %p\n' 2>/dev/null |
		sort -rn | head -n 8 | cut -d' ' -f2-
}
# tail_of N FILE [TITLE]: FILE's last N lines under a header
tail_of() {
	echo "--- ${3:-$2}: last $1 lines"
	tail -n "$1" "$2" 2>/dev/null
}

report() {
	local f n

	[ -n "${REPORTED:-}" ] && return 0
	REPORTED=1
	echo "=== failure report of $TEST_NAME"
	echo "step: '$LAST_NOTE', failed $(elapsed "$NOTE_US") s into it, $(elapsed) s into the test"
	[ -n "$WAIT_WHAT" ] && echo "waiting for: $WAIT_WHAT, for $(elapsed "$WAIT_US")s"
	if [ -z "${T:-}" ] || [ ! -d "$T" ]; then
		echo "=== end of the report (no test directory)"
		report_why
		return 0
	fi
	# criu's logs: the two last written in full detail, the others named
	n=0
	while read -r f; do
		n=$((n + 1))
		if [ $n -gt 2 ]; then
			echo "--- an earlier criu log: $f"
			continue
		fi
		echo "--- criu log $f: its errors and warnings (last 20)"
		grep -E "Error|Warn" "$f" | tail -n 20
		echo "--- $f: the plugin's lines (last 20)"
		grep "cuinterpose: " "$f" | tail -n 20
		tail_of 30 "$f"
	done < <(newest -name 'dump*.log' -o -name 'restore*.log' -o -name 'pre-dump*.log')
	for f in $(newest -name 'cuinterpose-guardian.log' | head -n 2); do tail_of 30 "$f" "guardian log $f"; done
	# the job's logs and the ranks' failure files, then the commands' outputs
	for f in $(newest -path "$T/w/*.failed" -o -name 'job*.log' -o -path "$T/w/*.log" -o -path "$T/*.log" \
		-not -name 'dump*.log' -not -name 'restore*.log' -not -name 'pre-dump*.log' -not -name 'cuinterpose-guardian.log'); do
		tail_of 30 "$f"
	done
	for f in $(newest -path "$T/*.out" | head -n 4); do tail_of 15 "$f"; done
	echo "=== end of the report (test directory $T$([ "${KEEP:-0}" = 1 ] && echo ", kept" || echo ", removed now: KEEP=1 keeps it"))"
	report_why
}
# report_why: the verdict again, last: a reader who sees only the log's
# tail (a CI summary) still learns what failed and where
report_why() {
	echo "FAIL: ${FAIL_WHY:-exited before its last step}; step '$LAST_NOTE'${WAIT_WHAT:+, waiting for $WAIT_WHAT}"
}

# at_exit COMMAND: run COMMAND when the test ends (the last added first),
# before cleanup.
AT_EXIT=
at_exit() { AT_EXIT="$1${AT_EXIT:+; $AT_EXIT}"; }
# The test's end: the report where it failed without one (a non-zero exit
# without fail(), or an exit 0 before `note done`), its own cleanups, then
# cleanup; exit 1 after any failure, never 0.
on_exit() {
	local rc=$1

	# Only the test shell: a child it forked for a command (`sleep 60 &`)
	# is a copy of it, EXIT trap included, until it execs the command, and
	# bash runs that trap when a signal ends the copy (a SIGTERM sent to the
	# pid before the exec, as a loaded machine lets happen). The copy ran
	# the test's end: a report, the job killed, $T removed under the test
	# shell, which went on (t-precopy: "wait_for: No record of process", the
	# copy's exit 0, then the test shell's nap FIFO gone). bash itself still
	# prints that line in such a copy; the test goes on.
	[ "$BASHPID" = "$MAINPID" ] || exit "$rc"
	trap - USR1
	if [ -z "${FAILED:-}" ] && [ "$rc" != 77 ]; then
		if [ "$rc" != 0 ]; then
			FAILED=1
			FAIL_WHY="the test exited with status $rc, without a message (see the lines above)"
			echo "FAIL: $FAIL_WHY"
			report
		elif [ -z "$DONE" ] && [[ $TEST_NAME == t-*.sh ]]; then
			FAILED=1
			FAIL_WHY="the test shell ended with status 0 before its last step (note done)"
			echo "FAIL: $FAIL_WHY"
			report
		fi
	fi
	[ -n "$AT_EXIT" ] && eval "$AT_EXIT"
	declare -F cleanup >/dev/null && cleanup
	[ -z "${FAILED:-}" ] || exit 1
	exit "$rc"
}
trap 'on_exit $?' EXIT

# nap SECONDS: sleep. Not `read -t` from a FIFO (used before, to poll
# without starting a process): bash 5.2.15's read -t, when its timeout has
# passed before the read itself starts (the shell descheduled for longer
# than the timeout, as a loaded machine does with 0.05 s naps), longjmps out
# and sets the shell's signal mask from a variable it never set: measured, a
# loop of such reads left SIGQUIT, SIGABRT and SIGBUS blocked (SigBlk 0x64)
# in the shell, whose state then depends on stack garbage (SIGCHLD or the
# SIGUSR1 of fail() could be next). A sleep process per nap costs about a
# millisecond of CPU.
nap() { sleep "$1"; }

[ "${LIB_REPORT_ONLY:-0}" = 1 ] && return 0

: "${top_builddir:?run through make check}"
B=$(cd "$top_builddir" && pwd)
CRIU=${CRIU:-$(command -v criu || echo /usr/local/sbin/criu)}
# Every criu call runs under contrib/bounded: a criu that hangs (CRIU 4.1.1
# on VMs without hardware breakpoints did, in every dump) fails its test
# after CUIP_CRIU_LIMIT_S seconds, naming the command and its log.
BOUNDED=$(cd "$srcdir/../.." && pwd)/contrib/bounded
CRIU_LIMIT_S=${CUIP_CRIU_LIMIT_S:-180}
bounded() { "$BOUNDED" "$CRIU_LIMIT_S" "$@"; }
PLUGIN=$B/plugin/.libs/cuinterpose_plugin.so
INTERPOSER=$B/interposer/.libs/libcuinterpose.so
FAKERUN=$B/test/fakecuda/fakecuda-run
WORKLOAD=$B/test/e2e/e2e_group

[ "$(id -u)" = 0 ] || skip "needs root for criu"
[ -x "$CRIU" ] || skip "criu not found"
[ -f "$PLUGIN" ] || skip "plugin not built ($PLUGIN)"
[ -f "$INTERPOSER" ] || skip "interposer not built ($INTERPOSER)"
[ -x "$FAKERUN" ] || skip "fake driver not built ($FAKERUN)"
[ -x "$WORKLOAD" ] || skip "workload not built ($WORKLOAD)"

T=$(mktemp -d /tmp/cuip-e2e.XXXXXX)
mkdir -p "$T/plugins" "$T/sock" "$T/w"
# failed_ranks: whether a rank of the job wrote a .failed file
failed_ranks() { compgen -G "$T/w/*.failed" >/dev/null; }
ln -s "$PLUGIN" "$T/plugins/cuinterpose_plugin.so"
export FAKECUDA_SOCKET=$T/devd.sock
export CUINTERPOSE_SOCKET_DIR=$T/sock
export CUINTERPOSE_STAGING_MB=4
export CUINTERPOSE_LOCK_TIMEOUT_MS=10000
SEQ=0
JOB=
# ASan builds: the runtime comes first in every preload list (the workloads
# are instrumented, the interposer too), and criu, which is not, gets it
# preloaded so that it can dlopen the instrumented plugin; criu_asan_init.so
# keeps ASan's start-up from breaking glibc's locale lock in criu (see
# criu_asan_init.c). criu frees little before it exits: leak checking would
# report criu, not the plugin, so it is off there (the workloads keep it).
SAN_PRELOAD=${CUIP_ASAN_RT:+$CUIP_ASAN_RT:}
SAN_CRIU=
if [ -n "${CUIP_ASAN_RT:-}" ]; then
	[ -f "$B/test/e2e/.libs/criu_asan_init.so" ] || skip "criu_asan_init.so not built"
	SAN_CRIU="env LD_PRELOAD=$CUIP_ASAN_RT:$B/test/e2e/.libs/criu_asan_init.so ASAN_OPTIONS=detect_leaks=0:handle_segv=0"
fi

# cleanup: the job, the test's own background commands (a criu dump left
# running, a holder), the fake's daemon and $T.
cleanup() {
	local p

	[ -n "$JOB" ] && kill -9 $(job_pids) 2>/dev/null
	for p in $(jobs -p); do kill -9 "$p" 2>/dev/null; done
	"$FAKERUN" --stop >/dev/null 2>&1
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}

# start_job NPROCS [--raw]: run e2e_group under the interposer and the fake.
start_job() {
	n=$1
	rm -f "$T"/w/*
	setsid env LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$FAKERUN" "$WORKLOAD" "$T/w" "$@" \
		</dev/null >"$T/job.log" 2>&1 &
	JOB=$!
	wait_ready "$n"
}

# job_refused VAR=VALUE...: e2e_group (one rank) under the interposer with
# these variables, which the job's settings table refuses: its first cuInit
# must fail (CUDA_ERROR_INVALID_VALUE) before anything changes. Its output
# in $T/refused.log, for the caller to find each variable named there.
job_refused() {
	mkdir -p "$T/refused" && rm -f "$T"/refused/* && touch "$T/refused.start"
	if env "$@" LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$BOUNDED" 60 "$FAKERUN" "$WORKLOAD" "$T/refused" 1 \
		</dev/null >"$T/refused.log" 2>&1; then
		fail "the job ran with $*: $(cat "$T/refused.log")"
	fi
	grep -q 'cuInit(0) failed: CUDA_ERROR_INVALID_VALUE' "$T/refused.log" ||
		fail "cuInit did not fail with $*: $(cat "$T/refused.log")"
	[ -z "$(find "$T/sock" -newer "$T/refused.start" -print -quit)" ] ||
		fail "the refused job made a control socket: $(ls "$T/sock")"
}

wait_ready() {
	local f ready

	waiting "the job's $1 ranks to be ready"
	i=0
	while :; do
		# non-empty files only: a rank creates its file, then writes its pid
		ready=0
		for f in "$T"/w/r*.ready; do [ -s "$f" ] && ready=$((ready + 1)); done
		[ $ready -ge "$1" ] && break
		failed_ranks && fail "job failed to start: $(cat "$T"/w/*.failed)"
		i=$((i + 1))
		[ $i -gt 300 ] && fail "job did not get ready: $ready of $1 ranks in $(elapsed "$WAIT_US") s"
		nap 0.05
	done
	waited
	JOBPID=$(pid_of 0)
}

job_pids() {
	local f w p

	for f in "$T"/w/r*.ready; do
		[ -f "$f" ] && read -r w p _ <"$f" && echo "$p"
	done
	return 0
}

# flip_byte FILE OFFSET: corrupt FILE by writing the complement of its byte
# at OFFSET (a fixed value would change nothing where the byte already is it).
flip_byte() {
	local b
	b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
	[ -n "$b" ] || fail "flip_byte: $1 has no byte $2"
	printf "\\$(printf %o $((255 - b)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

# cmd_sent NPROCS VERB [ARGS]: send a command to every rank and wait for all
# answers, whatever they say (answers prints them).
cmd_sent() {
	local n i f got # the caller's loop variables are not ours to change

	n=$1
	shift
	SEQ=$((SEQ + 1))
	echo "$SEQ $*" >"$T/w/cmd.tmp" && mv "$T/w/cmd.tmp" "$T/w/cmd"
	waiting "the answers of $n ranks to command $SEQ '$*'"
	i=0
	while :; do
		got=0
		for f in "$T"/w/r*."$SEQ"; do [ -e "$f" ] && got=$((got + 1)); done
		[ $got -ge "$n" ] && break
		failed_ranks && fail "'$*': $(cat "$T"/w/*.failed)"
		i=$((i + 1))
		[ $i -gt 400 ] && fail "no answer to '$*' (command $SEQ) from every rank in $(elapsed "$WAIT_US") s: $(missing_answers "$n")"
		nap 0.05
	done
	waited
}

# missing_answers NPROCS: which ranks did not answer command $SEQ, and
# whether their processes run
missing_answers() {
	local r p

	for ((r = 0; r < $1; r++)); do
		[ -e "$T/w/r$r.$SEQ" ] && continue
		p=$(pid_of $r 2>/dev/null)
		printf 'rank %s (pid %s, %s); ' $r "${p:-?}" "$(proc_state "$p")"
	done
}

# cmd NPROCS VERB [ARGS]: the same, and every rank must answer ok.
cmd() {
	local n r ans

	n=$1
	cmd_sent "$@"
	shift
	for ((r = 0; r < n; r++)); do
		read -r ans <"$T/w/r$r.$SEQ"
		case "$ans" in
		ok*) ;;
		*) fail "rank $r: '$*': $ans" ;;
		esac
	done
}

# answers of the last command, one line per rank
answers() {
	local r line

	for ((r = 0; r < $1; r++)); do
		while IFS= read -r line || [ -n "$line" ]; do echo "$line"; done <"$T/w/r$r.$SEQ"
	done
}

criu_dump() { # DIR [extra criu args]
	d=$1
	shift
	mkdir -p "$d"
	bounded "$FAKERUN" $SAN_CRIU "$CRIU" dump -t "$JOBPID" -D "$d" -L "$T/plugins" --shell-job -v4 -o dump.log "$@"
}

# The job's pids must be free before a restore: a killed process counts as
# gone for wait_gone once it is a zombie, but its pid stays taken until it
# is reaped ("Can't fork for PID: File exists"); wait up to 10 s for that.
wait_pids_free() {
	local busy p

	waiting "the job's pids to be free (reaped)"
	for _ in $(seq 200); do
		busy=0
		for p in $(job_pids); do [ -e /proc/$p ] && busy=1; done
		[ $busy = 0 ] && break
		nap 0.05
	done
	waited
	return 0
}

criu_restore() { # DIR [extra criu args]
	local rc log=restore.log a prev=

	d=$1
	shift
	# criu writes the log named by the last -o (a caller's comes after ours)
	for a in "$@"; do
		[ "$prev" = -o ] && log=$a
		prev=$a
	done
	wait_pids_free
	bounded "$FAKERUN" $SAN_CRIU "$CRIU" restore -D "$d" -L "$T/plugins" --shell-job --restore-detached -v4 \
		-o restore.log "$@"
	rc=$?
	[ $rc = 0 ] && : >"$T/restored-once"
	# ASan builds: criu's restore child can crash restoring an ASan process
	# (SIGSEGV right after it premaps the target's 15 TiB ASan shadow and
	# starts reading pages into it), in criu, before any plugin hook runs
	# for it: always for a process that was restored before (second
	# cycles), and for some first restores (seen with a preloaded child
	# that never used CUDA beside the participants). Measured with CRIU
	# 4.1.1 and GCC 12's libasan.
	if [ $rc != 0 ] && [ -n "${CUIP_ASAN_RT:-}" ] &&
		grep -q "killed by signal 11: Segmentation fault" "$d/$log"; then
		# to the test's own log too: callers may redirect this function
		{
			grep -m1 "killed by signal 11" "$d/$log"
			echo "SKIP: ASan build: criu's restore child crashes (SIGSEGV) restoring an ASan process ($([ -f "$T/restored-once" ] && echo "a later cycle; the first passed" || echo "first restore"))"
		} | tee -a /dev/fd/9
		exit 77
	fi
	return $rc
}

alive() { kill -0 "$1" 2>/dev/null; }
# stat_state, live: beside this file (the container tests source it from
# test/e2e with their own srcdir)
. "$(dirname "${BASH_SOURCE[0]}")/procstate.sh" || exit 99
# proc_state PID: running, stopped, a zombie (dead, not reaped) or gone
proc_state() {
	local st

	st=$(stat_state "$1")
	case $st in
	'') echo gone ;;
	Z) echo "a zombie: dead, not reaped" ;;
	X) echo "dead, being reaped" ;;
	T | t) echo "stopped ($st)" ;;
	*) echo "running ($st)" ;;
	esac
}

# app_maps PID: the process's mappings for leak checks. In ASan builds the
# anonymous ones are left out: ASan maps its allocator's size-class regions
# on demand and keeps freed large blocks mapped in its quarantine, so their
# count grows with every allocation and says nothing about a leak
# (LeakSanitizer checks those allocations instead). Device memory and every
# descriptor-backed mapping (the fake's arena, memfds) stay in the list.
app_maps() {
	if [ -n "${CUIP_ASAN_RT:-}" ]; then
		awk 'NF >= 6' /proc/"$1"/maps
	else
		cat /proc/"$1"/maps
	fi
}

# census [PIDS...]: one line per process (the job's by default): its pid and
# how many descriptors and mappings (app_maps) it has; the lists themselves
# go to $T/fds.PID.now and $T/maps.PID.now (census_diff shows what changed).
# With CENSUS_DEVMEM=1 a last line gives the bytes the fake device daemon's
# arenas hold (device memory in use, all devices).
census() {
	local p pids

	pids=${*:-$(job_pids)}
	for p in $pids; do
		echo "$p fds $(ls /proc/$p/fd 2>/dev/null | wc -l) maps $(app_maps $p 2>/dev/null | wc -l)"
		app_maps $p 2>/dev/null | awk '{print $1, $6}' >"$T/maps.$p.now"
		ls -l /proc/$p/fd 2>/dev/null | awk '{print $9, $11}' >"$T/fds.$p.now"
	done
	[ "${CENSUS_DEVMEM:-0}" = 1 ] && echo "device memory $(devmem_bytes)"
	return 0
}

# devmem_bytes: bytes allocated in the fake device daemon's arenas (their
# memfds, through /proc/DEVD/fd).
devmem_bytes() {
	local devd fd sum=0

	devd=$(cat "$FAKECUDA_SOCKET.pid" 2>/dev/null) || { echo none; return; }
	for fd in /proc/"$devd"/fd/*; do
		case "$(readlink "$fd" 2>/dev/null)" in
		*memfd:fakecuda-dev*) sum=$((sum + $(stat -L -c '%b * %B' "$fd"))) ;;
		esac
	done
	echo "$sum"
}

# census_diff: what differs between the lists of the reference census
# (census_keep) and those of the last census.
census_diff() {
	local f

	for f in "$T"/*.ref; do [ -f "${f%.ref}.now" ] && diff "$f" "${f%.ref}.now"; done
	return 0
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# census_keep TIMEOUT_S [PIDS...]: the reference census, CENSUS_REF, is a
# settled one: two readings taken 0.3 s apart agree (a descriptor or mapping
# that exists for a moment, e.g. a connection a dump leaves behind for a
# while on a loaded machine, is not part of it); its lists are the reference
# of census_diff. Fails the test, with the last two readings, when no two
# agree within TIMEOUT_S seconds.
census_keep() {
	local limit=$1 prev cur end f

	shift
	end=$(($(now_ms) + limit * 1000))
	waiting "a settled census (two equal readings 0.3 s apart)"
	cur=$(census "$@")
	while :; do
		prev=$cur
		nap 0.3
		cur=$(census "$@")
		[ "$cur" = "$prev" ] && break
		[ "$(now_ms)" -lt $end ] || fail "FDs, mappings or device memory did not settle in $limit s: last two readings
$prev
then
$cur"
	done
	waited
	for f in "$T"/*.now; do mv "$f" "${f%.now}.ref"; done
	CENSUS_REF=$cur
}

# census_back TIMEOUT_S WHAT [PIDS...]: wait until the census is CENSUS_REF
# again (descriptors and windows of released objects go away
# asynchronously: the interposer's threads, the fake's device worker);
# fails the test with both and the lists' differences when it is not within
# TIMEOUT_S seconds.
census_back() {
	local limit=$1 what=$2 cur end

	shift 2
	end=$(($(now_ms) + limit * 1000))
	waiting "$what: the census back to the reference"
	while :; do
		cur=$(census "$@")
		[ "$cur" = "$CENSUS_REF" ] && { waited; return 0; }
		[ "$(now_ms)" -lt $end ] || break
		nap 0.1
	done
	fail "$what: FDs, mappings or device memory leaked: before
$CENSUS_REF
after
$cur
$(census_diff)"
}

# start_reference WRITER [JOB ARGS...]: start the job ($N ranks), rank
# WRITER writes generation GEN=0 and every rank verifies it; their answers
# (the addresses) are $before, and warm_reference takes the reference census.
start_reference() {
	local writer=$1

	shift
	start_job "$N" "$@"
	GEN=0
	cmd "$N" write "$writer" "$GEN"
	cmd "$N" verify "$GEN"
	before=$(answers "$N")
	warm_reference
}

# warm_reference [PIDS...]: settle the interposers' lazily made state
# (export caches, staging) with one successful in-place checkpoint, check
# every rank ($N ranks at generation $GEN), then take the reference census
# (census_keep) of PIDS (the job's by default).
warm_reference() {
	note "warm-up dump"
	criu_dump "$T/warm" --leave-running || fail "warm-up dump"
	cmd "$N" verify "$GEN"
	census_keep 10 "$@"
}

# intact WHAT [PIDS...]: every participant alive, the $N ranks verify
# generation $GEN with the addresses they answered first ($before), and no
# FD, mapping or device memory leaked (census_back, against census_keep).
intact() {
	local what=$1 p

	shift
	for p in $(job_pids); do alive "$p" || fail "$what: pid $p died"; done
	cmd "$N" verify "$GEN"
	[ "$(answers "$N")" = "$before" ] || fail "$what: addresses changed: $(answers "$N") vs $before"
	census_back 5 "$what" "$@"
}

# wait_line FILE PATTERN: wait until FILE has a line matching PATTERN (an
# event the test reacts to: the log line is written before the state it
# names is left).
wait_line() {
	local i=0

	waiting "a line /$2/ in $1"
	while ! grep -qE "$2" "$1" 2>/dev/null; do
		i=$((i + 1))
		[ $i -gt 1200 ] && fail "no line /$2/ in $1 in $(elapsed "$WAIT_US") s"
		nap 0.05
	done
	waited
}

# Fault injection through the fake driver (the test sets FAKECUDA_FAIL_DIR):
# arm PID|any SPEC makes the next matching call of PID (of any process) fail.
arm() {
	echo "$2" >"$FAKECUDA_FAIL_DIR/.tmp" && mv "$FAKECUDA_FAIL_DIR/.tmp" "$FAKECUDA_FAIL_DIR/$1"
}
disarm() { rm -f "$FAKECUDA_FAIL_DIR"/*; }
pid_of() { # pid_of RANK
	local w p
	read -r w p _ <"$T/w/r$1.ready" && echo "$p"
}

# writes_reach_everyone: every one of the $N ranks in turn writes a new
# generation ($GEN counts on) and every rank sees it.
writes_reach_everyone() {
	local k

	for k in $(seq 0 $((N - 1))); do
		GEN=$((GEN + 1))
		cmd "$N" write "$k" "$GEN"
		cmd "$N" verify "$GEN"
	done
}

# guardian_done DIR: wait (bounded) for the guardian's verdict in DIR's log,
# written when its rollback has finished; fail unless the rollback
# completed; print its line.
guardian_done() {
	local glog=$1/cuinterpose-guardian.log

	waiting "the guardian's verdict in $glog"
	for _ in $(seq 600); do
		grep -qs "rollback complete\|ROLLBACK FAILED" "$glog" && break
		nap 0.05
	done
	grep -qs "rollback complete" "$glog" ||
		fail "no completed rollback in $glog after $(elapsed "$WAIT_US") s: $(tail -n 20 "$glog" 2>&1)"
	waited
	grep -h "rollback complete" "$glog" | sed 's/.*rollback complete/rollback complete/'
}

# criu_main DIR ACTION: the criu process itself (comm criu, its parent
# timeout, from contrib/bounded), found with builtins only: a timed kill
# must not wait for a pgrep on a loaded machine
criu_main() {
	local d c st a

	for d in /proc/[0-9]*; do
		read -r c 2>/dev/null <"$d/comm" && [ "$c" = criu ] || continue
		read -r st 2>/dev/null <"$d/stat" || continue
		st=${st##*) }
		read -r _ st _ <<<"$st"
		read -r c 2>/dev/null <"/proc/$st/comm" && [ "$c" = timeout ] || continue
		mapfile -d '' -t a 2>/dev/null <"$d/cmdline"
		[ "${a[1]:-}" = "$2" ] && [[ " ${a[*]} " == *" -D $1 "* ]] || continue
		echo "${d#/proc/}"
		return 0
	done
	return 1
}

# wait_gone PIDS...: wait until none runs (10 s at most), then give the
# reaper up to 10 s more to reap them: a zombie still holds its pid, and a
# restore of that pid fails "Can't fork for PID: File exists". A process
# that stays a zombie (its parent does not wait) counts as gone.
wait_gone() {
	waiting "pids $* to be gone"
	i=0
	for p in "$@"; do
		while live "$p"; do
			i=$((i + 1))
			[ $i -gt 200 ] && return 1
			nap 0.05
		done
	done
	i=0
	for p in "$@"; do
		while [ -d /proc/$p ] && [ $i -lt 200 ]; do
			i=$((i + 1))
			nap 0.05
		done
	done
	waited
	return 0
}

# job_exit N: tell the job's N ranks to exit and wait (wait_gone's bound)
# until its processes are gone; the pids are read before they can go.
job_exit() {
	local pids
	pids=$(job_pids)
	cmd "$1" exit
	wait_gone $pids
}

# stored FILE: the bytes FILE takes on disk (holes and inherited chunks take none)
stored() { echo $(($(stat -c %b "$1") * $(stat -c %B "$1"))); }
# need_holes: skip unless the file system of $T keeps holes (a sparse file stores nothing)
need_holes() {
	local probe=$T/holes.probe s
	truncate -s 1M "$probe" && s=$(stored "$probe")
	rm -f "$probe"
	[ "${s:-x}" = 0 ] || skip "the file system of $T keeps no holes (a 1 MiB sparse file stores ${s:-?} bytes)"
}

# machine SEED [DEVICES]: the devd of this test now runs another machine
# (other GPU UUIDs from the seed; 2 devices unless told)
machine() {
	"$FAKERUN" --stop
	export FAKECUDA_UUID_SEED=$1 FAKECUDA_DEVICES=${2:-2}
	"$FAKERUN" --start || fail "devd for machine $1"
}
# uuids: the GPU UUIDs of the machine the devd runs now, on one line
uuids() { FAKECUDA_SOCKET=$FAKECUDA_SOCKET "$FAKERUN" "$B/test/fakecuda/fakecuda-ckpt" --uuids | tr '\n' ' '; }

# named_cgroups_mountable: criu dumping a process whose cgroups differ from
# its own mounts each cgroup-v1 hierarchy the process is in, a named one by
# its name alone (-o name=X). Linux 6.18 refuses that (EINVAL) for a named
# hierarchy that is mounted nowhere and holds no group, which a tool that
# removed its group just before unmounting can leave behind (zdtm does:
# test/zdtm/t-zdtm-plugin.sh removes it). Fails the test naming the hierarchy
# before criu fails on it with a message about subsystems.
named_cgroups_mountable() {
	local d n bad=
	d=$(mktemp -d "$T/cg.XXXXXX")
	for n in $(sed -n 's/^[0-9]*:name=\([^:]*\):.*/\1/p' /proc/self/cgroup); do
		if mount -t cgroup -o "name=$n" cuip-probe "$d" 2>/dev/null; then
			umount "$d"
		else
			bad="$bad $n"
		fi
	done
	rmdir "$d"
	[ -z "$bad" ] || fail "the named cgroup-v1 hierarchies$bad are listed in /proc/self/cgroup but cannot" \
		"be mounted by name, so criu cannot dump a process in a cgroup of its own on this machine;" \
		"mount each with -o none,name=NAME and unmount it to remove it"
}
