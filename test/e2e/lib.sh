# lib.sh - shared helpers of the CRIU end-to-end tests (sourced by t-*.sh).
#
# Each test gets its own directory ($T), fake device daemon socket, interposer
# socket directory and CRIU plugin directory (holding only our plugin), runs
# the job from e2e_group under the fake driver, and cleans up everything it
# started. Exit 77 (skip) when root, criu or the built pieces are missing.
# In sanitizer builds criu runs with the sanitizer runtime preloaded.

set -u

skip() { echo "SKIP: $*"; exit 77; }
exec 9>&1 # the test's log, for messages from functions whose output a caller redirects
fail() {
	FAILED=1
	echo "FAIL: $*"
	[ -n "${T:-}" ] && dump_logs
	exit 1
}
note() { echo "--- $* ($(elapsed)s)"; }

START=$(date +%s.%N)
elapsed() { echo "$(date +%s.%N) $START" | awk '{printf "%.1f", $1 - $2}'; }

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
# nap SECONDS: sleep without starting a process (a read that times out on a
# FIFO nobody writes, opened read-write so that the open does not block).
# The polling loops below run many times a second in every test: measured
# with perf on the 2-core VM, the test shells' forks (sleep, ls, wc, find,
# cat, awk, seq in subshells) took about a third of the CPU of `make check`.
mkfifo "$T/nap"
nap() { read -r -t "$1" _ <>"$T/nap" || :; }
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

cleanup() {
	[ -n "$JOB" ] && kill -9 $(job_pids) 2>/dev/null
	"$FAKERUN" --stop >/dev/null 2>&1
	if [ "${KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
# An exit that fail() did not announce (a shell error, an exit from a
# helper) names itself in the log before the cleanup.
exit_note() {
	[ "$1" = 0 ] || [ "$1" = 77 ] || [ -n "${FAILED:-}" ] ||
		echo "FAIL: the test exited with status $1 after its last step above, without a message"
}
trap 'exit_note $?; cleanup' EXIT

dump_logs() {
	for f in "$T"/*.log "$T"/w/*.failed "$T"/w/*.log; do
		[ -f "$f" ] || continue
		echo "=== $f"
		grep -E "cuinterpose|Error|error|FAIL|fail" "$f" | tail -40
	done
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

wait_ready() {
	local f ready

	i=0
	while :; do
		# non-empty files only: a rank creates its file, then writes its pid
		ready=0
		for f in "$T"/w/r*.ready; do [ -s "$f" ] && ready=$((ready + 1)); done
		[ $ready -ge "$1" ] && break
		failed_ranks && fail "job failed to start: $(cat "$T"/w/*.failed)"
		i=$((i + 1))
		[ $i -gt 300 ] && fail "job did not get ready"
		nap 0.05
	done
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
	i=0
	while :; do
		got=0
		for f in "$T"/w/r*."$SEQ"; do [ -e "$f" ] && got=$((got + 1)); done
		[ $got -ge "$n" ] && break
		failed_ranks && fail "'$*': $(cat "$T"/w/*.failed)"
		i=$((i + 1))
		[ $i -gt 400 ] && fail "no answer to '$*' from every rank"
		nap 0.05
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

	for _ in $(seq 200); do
		busy=0
		for p in $(job_pids); do [ -e /proc/$p ] && busy=1; done
		[ $busy = 0 ] && return 0
		nap 0.05
	done
	return 0
}

criu_restore() { # DIR [extra criu args]
	local rc

	d=$1
	shift
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
		grep -q "killed by signal 11: Segmentation fault" "$d/restore.log"; then
		# to the test's own log too: callers may redirect this function
		{
			grep -m1 "killed by signal 11" "$d/restore.log"
			echo "SKIP: ASan build: criu's restore child crashes (SIGSEGV) restoring an ASan process ($([ -f "$T/restored-once" ] && echo "a later cycle; the first passed" || echo "first restore"))"
		} | tee -a /dev/fd/9
		exit 77
	fi
	return $rc
}

alive() { kill -0 "$1" 2>/dev/null; }

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
	while :; do
		cur=$(census "$@")
		[ "$cur" = "$CENSUS_REF" ] && return 0
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

	while ! grep -qE "$2" "$1" 2>/dev/null; do
		i=$((i + 1))
		[ $i -gt 1200 ] && fail "no line /$2/ in $1"
		nap 0.05
	done
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

	for _ in $(seq 600); do
		grep -qs "rollback complete\|ROLLBACK FAILED" "$glog" && break
		nap 0.05
	done
	grep -qs "rollback complete" "$glog" || fail "no completed rollback in $glog: $(cat "$glog" 2>&1)"
	grep -h "rollback complete" "$glog" | sed 's/.*rollback complete/rollback complete/'
}

# wait_gone PIDS...: wait until none runs (10 s at most), then give the
# reaper up to 10 s more to reap them: a zombie still holds its pid, and a
# restore of that pid fails "Can't fork for PID: File exists". A process
# that stays a zombie (its parent does not wait) counts as gone.
wait_gone() {
	i=0
	for p in "$@"; do
		while alive "$p" && [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" != Z ]; do
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
