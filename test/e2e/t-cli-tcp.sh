# `cuinterpose checkpoint` and `restore` on a job holding an established
# TCP connection, as a torch.distributed job's store does: the job's root
# (a python3 process leading its session) talks over loopback TCP with its
# forked child and runs the CUDA job (e2e_group, two ranks sharing memory)
# below it.
# - checkpoint picks --tcp-established (and --network-lock nftables only
#   where criu cannot run iptables), says why naming the pid and the
#   connection, records the flags in DIR/cuinterpose-criu-flags, and the
#   dump succeeds;
# - restore passes the same flags, says so, and the connection carries
#   bytes both ways afterwards; the CUDA job keeps every byte and address;
# - a second checkpoint into the same DIR of a tree without any TCP
#   connection (the plain CUDA job) picks nothing and removes the record.
. "$srcdir/lib.sh"

CLI=$B/cli/cuinterpose
[ -x "$CLI" ] || skip "cuinterpose not built ($CLI)"
command -v python3 >/dev/null || skip "python3 not installed"

CRIU_RUN=$CRIU
if [ -n "$SAN_CRIU" ]; then
	CRIU_RUN=$T/criu
	printf '#!/bin/sh\nexec %s %s "$@"\n' "$SAN_CRIU" "$CRIU" >"$CRIU_RUN" && chmod +x "$CRIU_RUN"
fi

# front COMMAND ARGS...: the front end, bounded; stdout $T/out, stderr
# $T/err, exit status $rc.
front() {
	"$BOUNDED" $((CRIU_LIMIT_S + 30)) "$FAKERUN" "$CLI" "$1" --libdir "$T/plugins" --criu "$CRIU_RUN" \
		--timeout "$CRIU_LIMIT_S" "${@:2}" </dev/null >"$T/out" 2>"$T/err"
	rc=$?
	{ echo "=== cuinterpose $* (exit $rc)"; cat "$T/err"; } >>"$T/front.log"
}

cmdline() { # FILE COMMAND
	grep -a -m1 "^cuinterpose $2: running: " "$1" || fail "no criu command line in $1: $(cat "$1")"
}

# The root: listens on 127.0.0.1 (any port), forks a child that connects
# and echoes what it reads, then starts the CUDA job and serves commands
# from $T/tcp/cmd ("SEQ WORD": send WORD to the child, write its answer to
# $T/tcp/SEQ). Polling, so that it goes on as it was after a restore.
mkdir -p "$T/tcp"
cat >"$T/tcp.py" <<'EOF'
import os, socket, subprocess, sys, time
d = sys.argv[1]
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(1)
port = ls.getsockname()[1]
if os.fork() == 0:
    ls.close()
    c = socket.create_connection(("127.0.0.1", port))
    while True:
        b = c.recv(4096)
        if not b:
            os._exit(0)
        c.sendall(b"echo " + b)
s, _ = ls.accept()
ls.close()
job = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL)
done = 0
while True:
    try:
        with open(d + "/cmd") as f:
            seq, word = f.read().split()
    except (OSError, ValueError):
        seq, word = "0", ""
    if int(seq) > done:
        done = int(seq)
        if word == "exit":
            job.wait()
            os._exit(0)
        s.sendall(word.encode())
        got = s.recv(4096).decode()
        with open(d + "/" + seq + ".tmp", "w") as f:
            f.write(got + "\n")
        os.rename(d + "/" + seq + ".tmp", d + "/" + seq)
    time.sleep(0.05)
EOF
PYROOT=
TSEQ=0
cleanup_all() {
	local c

	if [ -n "$PYROOT" ]; then
		for c in $(cat /proc/"$PYROOT"/task/*/children 2>/dev/null); do kill -9 "$c" 2>/dev/null; done
		kill -9 "$PYROOT" 2>/dev/null
	fi
	cleanup
}
trap cleanup_all EXIT

# ping WORD: the root sends WORD over TCP, the child must echo it.
ping() {
	TSEQ=$((TSEQ + 1))
	echo "$TSEQ $1" >"$T/tcp/cmd.tmp" && mv "$T/tcp/cmd.tmp" "$T/tcp/cmd"
	for _ in $(seq 400); do
		[ -f "$T/tcp/$TSEQ" ] && break
		nap 0.05
	done
	[ "$(cat "$T/tcp/$TSEQ" 2>/dev/null)" = "echo $1" ] ||
		fail "TCP: sent '$1', got '$(cat "$T/tcp/$TSEQ" 2>/dev/null)'"
}

rm -f "$T"/w/*
setsid python3 "$T/tcp.py" "$T/tcp" env LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$FAKERUN" "$WORKLOAD" "$T/w" 2 \
	</dev/null >"$T/job.log" 2>&1 &
PYROOT=$!
JOB=$PYROOT
wait_ready 2
cmd 2 verify 0
before=$(answers 2)
ping hello
grep -q " 01 " /proc/"$PYROOT"/net/tcp || fail "no established TCP connection: $(cat /proc/"$PYROOT"/net/tcp)"
pids="$PYROOT $(job_pids)"

note "checkpoint"
front checkpoint "$PYROOT" "$T/d1"
[ $rc = 0 ] || fail "cuinterpose checkpoint: exit $rc: $(tail -15 "$T/err")"
line=$(cmdline "$T/err" checkpoint)
case "$line " in *" --tcp-established "*) ;; *) fail "no --tcp-established in: $line" ;; esac
if grep -q "^cuinterpose checkpoint: --tcp-established --network-lock nftables: " "$T/err"; then
	lock=" --network-lock nftables"
	case "$line " in *" --network-lock nftables "*) ;; *) fail "no --network-lock nftables in: $line" ;; esac
else
	lock=
	case "$line " in *" --network-lock "*) fail "--network-lock in: $line" ;; esac
fi
grep -Eq "^cuinterpose checkpoint: --tcp-established$lock: pid [0-9]+ \(python3\) holds 2 connected TCP socket\(s\) \(127\.0\.0\.1:[0-9]+ <-> 127\.0\.0\.1:[0-9]+; " \
	"$T/err" || fail "no reason given for --tcp-established: $(cat "$T/err")"
[ "$(cat "$T/d1/cuinterpose-criu-flags")" = "--tcp-established$lock" ] ||
	fail "recorded flags: '$(cat "$T/d1/cuinterpose-criu-flags")'"
grep -q "cuinterpose: PAUSE_DEVICES done: 2 participants" "$T/err" || fail "no PAUSE_DEVICES summary: $(cat "$T/err")"
wait_gone $pids || fail "dumped processes still alive"

note "restore"
wait_pids_free
front restore "$T/d1"
if [ $rc != 0 ] && [ -n "${CUIP_ASAN_RT:-}" ] && grep -q "killed by signal 11" "$T/d1/restore.log"; then
	skip "ASan build: criu's restore child crashes (SIGSEGV) restoring an ASan process"
fi
[ $rc = 0 ] || fail "cuinterpose restore: exit $rc: $(tail -15 "$T/err")"
[ "$(cat "$T/out")" = "$PYROOT" ] || fail "restore printed '$(cat "$T/out")', not the root $PYROOT"
line=$(cmdline "$T/err" restore)
case "$line " in *" --tcp-established$lock "*) ;; *) fail "no --tcp-established$lock in: $line" ;; esac
grep -q "^cuinterpose restore: --tcp-established$lock: the checkpoint holds connected TCP sockets (recorded by its dump in $T/d1/cuinterpose-criu-flags)$" \
	"$T/err" || fail "restore did not say why: $(cat "$T/err")"
ping again
ping "$(head -c 300 /dev/zero | tr '\0' x)"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "addresses changed"
writes_reach_everyone

note "a tree without TCP connections into the same directory"
pids=$(job_pids)
front checkpoint "$JOBPID" "$T/d1" -- --leave-running
[ $rc = 0 ] || fail "cuinterpose checkpoint of the CUDA job: exit $rc: $(tail -15 "$T/err")"
line=$(cmdline "$T/err" checkpoint)
case "$line " in *" --tcp-established "* | *" --network-lock "*) fail "TCP flags picked for: $line" ;; esac
[ -e "$T/d1/cuinterpose-criu-flags" ] && fail "the earlier checkpoint's record is left"
cmd 2 verify 0
ping last
cmd 2 exit
echo "$((TSEQ + 1)) exit" >"$T/tcp/cmd.tmp" && mv "$T/tcp/cmd.tmp" "$T/tcp/cmd"
note done
