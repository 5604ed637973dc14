#!/usr/bin/env bash
# demo-job.sh BUILDDIR: the demo itself (contrib/demo.sh sets it up).
# cuinterpose-example: a parent and 3 children share three VMM allocations
# through POSIX file descriptors, beside private GPU memory. Every process
# reports its pid and, per allocation, address and checksum of the bytes
# (SIGUSR2) before `criu dump` and after `criu restore`; the demo prints
# both side by side and says which are equal, then runs a round in which
# the job itself verifies every byte and the sharing (SIGUSR1).
set -euo pipefail
build=$1
D=/tmp/cuinterpose-demo
rm -rf "$D"
mkdir -p "$D/img" "$D/sock"
say() { printf '\n== %s\n' "$*"; }
# criu runs under a bound (contrib/bounded): a criu that hangs is named and
# killed instead of holding the demo forever. criu_failed LOG says why.
BOUNDED=$(cd "$(dirname "$0")" && pwd)/bounded
# live PID: one read of its stat (the tests' own reader, test/e2e/procstate.sh;
# beside this script where it was copied out of the tree)
here=$(dirname "$BOUNDED")
if [ -f "$here/procstate.sh" ]; then . "$here/procstate.sh"; else . "$here/../test/e2e/procstate.sh"; fi
criu_failed() {
	echo "criu failed; its log: $1"
	grep -E "Error|cuinterpose:.*(refus|fail)" "$1" | tail -n 5
	exit 1
}
# The job's control sockets live in the demo's own directory.
export CUINTERPOSE_SOCKET_DIR=$D/sock
# Where cuinterpose is installed (make install: /usr/local, the plugin in
# CRIU's own /usr/lib/criu; a --prefix install keeps it in PREFIX/lib/criu).
prefix=$(dirname "$(dirname "$(command -v cuinterpose)")")
L=()
[ -f "$prefix/lib/criu/cuinterpose_plugin.so" ] && L=(-L "$prefix/lib/criu")

if [ -e /proc/driver/nvidia/gpus ] && ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1; then
	RUN=()
	echo "NVIDIA driver found: running on the GPU"
else
	export FAKECUDA_SOCKET=$D/devd.sock
	RUN=("$prefix/lib/cuinterpose/fakecuda/fakecuda-run")
	echo "no NVIDIA GPU: running on the fake CUDA driver (device memory lives in fakecuda-devd)"
fi
cleanup() {
	# only what is still running (the job exits by itself at the end)
	[ -n "${job:-}" ] && kill -9 $job $(cat "$D/ready" 2>/dev/null) 2>/dev/null || true
	[ ${#RUN[@]} -gt 0 ] && "${RUN[0]}" --stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

wait_line() { # PATTERN: wait for a line of the results file
	for _ in $(seq 400); do
		grep -q "$1" "$D/results" 2>/dev/null && return 0
		sleep 0.05
	done
	echo "no '$1' in $D/results:"
	cat "$D/results" "$D/job.log"
	exit 1
}
state() { # N: every process reports pid, addresses and checksums
	kill -USR2 "$parent"
	wait_line "^state $1 \(ok\|FAIL\)"
	grep -q "^state $1 ok" "$D/results" || { grep "^state $1 FAIL" "$D/results"; exit 1; }
}

say "start the job: cuinterpose run -- cuinterpose-example -n 3"
setsid "${RUN[@]}" cuinterpose run -- cuinterpose-example -n 3 -r "$D/ready" -o "$D/results" \
	</dev/null >"$D/job.log" 2>&1 &
job=$!
disown "$job"
for _ in $(seq 400); do [ -s "$D/ready" ] && break; sleep 0.05; done
[ -s "$D/ready" ] || { cat "$D/job.log"; exit 1; }
read -r parent children <"$D/ready"
echo "processes: parent $parent, children $children"
say "what the interposer tracks in the parent (cuinterpose inspect $parent)"
cuinterpose inspect "$parent" >"$D/inspect.txt"
n=$(wc -l <"$D/inspect.txt")
head -n 20 "$D/inspect.txt"
[ "$n" -le 20 ] || echo "... ($((n - 20)) more lines: cuinterpose inspect $parent)"
say "before the checkpoint: every process verifies its memory, then reports it"
kill -USR1 "$parent"
wait_line "^round 1 "
grep "^round 1 " "$D/results"
grep -q "^round 1 ok" "$D/results"
state 1

say "criu dump -t $parent -D $D/img"
"$BOUNDED" 300 "${RUN[@]}" criu dump -t "$parent" -D "$D/img" "${L[@]}" -v4 -o dump.log ||
	criu_failed "$D/img/dump.log"
grep "cuinterpose:" "$D/img/dump.log" | grep -vE ": pid [0-9]+ done" | grep -E "participants|SAVE|NATIVE|bytes|done" |
	sed "s/^/  /"
ls -la "$D/img" | grep cuinterpose | sed 's/^/  /'
for p in $parent $children; do
	if live "$p"; then
		echo "process $p still running after dump"
		exit 1
	fi
done
echo "the job is gone; its GPU memory was released"

say "the checkpoint's cuinterpose images (cuinterpose show $D/img)"
cuinterpose show "$D/img" | grep -E "^inventory|participants|^== |^  [0-9a-f]+:[0-9]+  cuinterpose-carrier|^OK|^FAIL"

say "criu restore -D $D/img"
"$BOUNDED" 300 "${RUN[@]}" criu restore -D "$D/img" "${L[@]}" --restore-detached --pidfile "$D/restored.pid" \
	-v4 -o restore.log || criu_failed "$D/img/restore.log"
grep "cuinterpose:" "$D/img/restore.log" | grep -vE ": pid [0-9]+ done" |
	grep -E "participants|LOAD|REBUILD|VERIFY|NATIVE|done" | sed "s/^/  /"
[ "$(cat "$D/restored.pid")" = "$parent" ] || { echo "restored as pid $(cat "$D/restored.pid"), not $parent"; exit 1; }
state 2

say "before the dump | after the restore, per process and allocation"
# state lines: "state N rank K pid P: NAME VA SIZE MiB SUM ..." -> one row per allocation
rows() { grep "^state $1 rank" "$D/results" | awk '{ r = $4; sub(":", "", $6); printf "rank %s pid %s\n", r, $6
	for (i = 7; i + 4 <= NF + 1; i += 5) printf "rank %s %s %s %s %s %s\n", r, $i, $(i+1), $(i+2), $(i+3), $(i+4) }'; }
rows 1 >"$D/before"
rows 2 >"$D/after"
same=0
diff=0
while read -r -u 3 b && read -r -u 4 a; do
	if [ "$b" = "$a" ]; then
		mark=equal
		same=$((same + 1))
	else
		mark=DIFFERENT
		diff=$((diff + 1))
	fi
	printf '  %-52s | %-52s %s\n' "$b" "${a#rank * }" "$mark"
done 3<"$D/before" 4<"$D/after"
[ "$(wc -l <"$D/before")" = "$(wc -l <"$D/after")" ] || { echo "not the same number of processes and allocations"; exit 1; }
echo "  (row: name, address, size, checksum of the bytes; pids: one row per process)"
echo "  $same equal, $diff different"
[ "$diff" = 0 ] || exit 1

say "after the restore: the job verifies every byte and the sharing itself"
kill -USR1 "$parent"
wait_line "^round 2 "
grep "^round 2 " "$D/results"
grep -q "^round 2 ok" "$D/results"
kill -TERM "$parent"
# wait for the job to tear down and exit, so that nothing of it is left
for _ in $(seq 400); do
	gone=1
	for p in $parent $children; do
		live "$p" && gone=0
	done
	[ $gone = 1 ] && break
	sleep 0.05
done
[ $gone = 1 ] || { echo "the job did not exit after SIGTERM"; exit 1; }
job=
left=$(ls -A "$D/sock")
[ -z "$left" ] || { echo "control sockets left behind in $D/sock: $left"; exit 1; }
echo
echo "demo: 4 processes sharing GPU memory checkpointed and restored: same pids, addresses and bytes; no socket left"
