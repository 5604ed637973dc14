# CUINTERPOSE_RELEASE=python:STATEMENT runs the statement in the job's own
# interpreter before the checkpoint (the mechanism `torch` and `cupy` use):
# a Python job (e2e_python.py, CUDA through ctypes) frees its 32 MiB cache
# in release(); the carrier then holds only its 2 MiB live buffer, its log
# counts the 32 MiB freed, and after the restore the buffer's bytes and
# address are back and the cache is allocated again. A statement that
# raises costs only what it would have freed: its traceback is on the job's
# stderr, the dump goes on carrying the cache, and the job restores.
. "$srcdir/lib.sh"

PY=$(command -v python3) || skip "python3 not found"
JOBPY=$srcdir/e2e_python.py
CACHE=$((32 << 20))

start_py() { # STATEMENT
	rm -f "$T"/w/*
	setsid env LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" CUINTERPOSE_LOG=2 CUINTERPOSE_RELEASE="python:$1" \
		"$FAKERUN" "$PY" "$JOBPY" "$T/w" </dev/null >"$T/job.log" 2>&1 &
	JOB=$!
	wait_ready 1
}
carrier_bytes() { cat "$1"/cuinterpose-carrier-*.img 2>/dev/null | wc -c; }

note "1: a statement that raises"
start_py "broken()"
cmd 1 verify
before=$(answers 1)
pid=$(job_pids)
criu_dump "$T/broken" || fail "criu dump with a raising release statement"
wait_gone $pid || fail "dumped process still alive"
grep -q "ValueError: a release hook that fails" "$T/job.log" || fail "no traceback on the job's stderr: $(tail -n 5 "$T/job.log")"
grep -q "CUINTERPOSE_RELEASE=python:broken() raised an exception (its traceback is on stderr); the checkpoint carries" "$T/job.log" ||
	fail "the failed release is not reported: $(grep -h cuinterpose "$T/job.log" | tail -n 3)"
n=$(carrier_bytes "$T/broken")
[ "$n" -gt $CACHE ] || fail "the carrier holds $n bytes: the cache the statement kept was not carried"
criu_restore "$T/broken" || fail "criu restore after a raising release statement"
cmd 1 verify
[ "$(answers 1)" = "$before" ] || fail "answers differ: $(answers 1) vs $before"
job_exit 1 || fail "the job did not exit"

note "2: release() frees the cache"
start_py "release()"
cmd 1 verify
before=$(answers 1)
pid=$(job_pids)
criu_dump "$T/d" || fail "criu dump with python:release()"
wait_gone $pid || fail "dumped process still alive"
n=$(carrier_bytes "$T/d")
[ "$n" -lt $CACHE ] || fail "the carrier holds $n bytes: the released cache was carried"
grep -q "release hooks: $CACHE of [0-9]* carried bytes freed" "$T/job.log" ||
	fail "the log does not count the $CACHE bytes freed: $(grep -h 'release hooks' "$T/job.log")"
criu_restore "$T/d" || fail "criu restore after python:release()"
cmd 1 verify
[ "$(answers 1)" = "$before" ] || fail "answers differ after the release: $(answers 1) vs $before"
cmd 1 exit
note done
