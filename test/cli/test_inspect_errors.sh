#!/bin/sh
# test_inspect_errors.sh: what `cuinterpose inspect` says when a control
# socket answers the handshake but not with a process state: a refused
# INSPECT names the request and the server's reason, a reply of the wrong
# kind is a protocol error; both exit 1. The server is fakectl (a scripted
# stand-in for the interposer's control socket). No root, CRIU or driver.
set -u
cli=$CUIP_CLI
T=$(mktemp -d "${TMPDIR:-/tmp}/cuip-inspect.XXXXXX")
srv=
trap '[ -n "$srv" ] && kill "$srv" 2>/dev/null; rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; cat "$T/out" "$T/srv.out" 2>/dev/null; exit 1; }
mkdir "$T/sock"
export CUINTERPOSE_SOCKET_DIR="$T/sock"

# start MODE: a fakectl answering MODE, its pid in $srv once it listens
start() {
	# A fresh file: the shell truncates the old one only once the
	# background child runs, and its "ready" must not be read as ours.
	rm -f "$T/srv.out"
	./fakectl "$T/sock" "$1" >"$T/srv.out" 2>&1 &
	srv=$!
	i=0
	while ! grep -q ready "$T/srv.out" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
	grep -q ready "$T/srv.out" || fail "fakectl $1 did not start"
}
stop() {
	kill "$srv"
	wait "$srv" 2>/dev/null
	srv=
}

start refuse
"$cli" inspect "$srv" >"$T/out" 2>&1
[ $? = 1 ] || fail "a refused INSPECT did not exit 1"
grep -qx "cuinterpose inspect: process $srv: INSPECT refused: busy right now" "$T/out" ||
	fail "no line naming the refused INSPECT"
stop

start nostate
"$cli" inspect "$srv" --json >"$T/out" 2>&1
[ $? = 1 ] || fail "a reply without a process state did not exit 1"
grep -qx "cuinterpose inspect: process $srv: INSPECT reply carries no process state" "$T/out" ||
	fail "no line naming the reply without a state"
stop
echo PASS
