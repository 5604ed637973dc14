# Another uid (nobody) against a running sharing job of root: it cannot
# connect to a participant's control socket (the file is 0600; with the mode
# loosened, the interposer still refuses the peer by SO_PEERCRED), cannot
# `cuinterpose inspect` it, cannot fetch the memory behind a stolen ticket,
# and cannot checkpoint it; the job keeps running with every byte intact.
. "$srcdir/lib.sh"

command -v setpriv >/dev/null || skip "setpriv (util-linux) not found"
NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"
THIEF=$B/test/e2e/e2e_thief
CLI=$B/cli/cuinterpose
N=4

# Only the socket's own mode and the interposer may stand in the way.
chmod 0711 "$T"
chmod 0755 "$T/sock"
start_job $N
cmd $N verify 0
before=$(answers $N)
pids=$(job_pids)
sock=$(ls "$T"/sock/"$JOBPID"-*.sock) || fail "no control socket of pid $JOBPID"
[ "$(stat -c %a "$sock")" = 600 ] || fail "socket mode $(stat -c %a "$sock"), want 600"

note "connect as nobody"
out=$($NOBODY "$THIEF" connect "$sock") || fail "nobody connected: $out"
[ "$out" = "connect: Permission denied" ] || fail "connect: '$out'"

note "inspect as nobody"
$NOBODY "$CLI" inspect "$JOBPID" >"$T/inspect.out" 2>"$T/inspect.err" && fail "inspect as nobody succeeded"
rc=$?
[ $rc = 1 ] || fail "inspect as nobody: exit $rc, want 1"
# Refused at the socket's mode, or earlier at /proc/PID/fd where the
# process is not readable by others.
grep -Eq "cuinterpose inspect: (cannot connect to $sock: Permission denied|process $JOBPID has no cuinterpose control socket.*no permission to read /proc/$JOBPID)" \
	"$T/inspect.err" || fail "inspect as nobody: '$(cat "$T/inspect.err")'"
[ -s "$T/inspect.out" ] && fail "inspect as nobody printed state: $(cat "$T/inspect.out")"

note "stolen ticket"
r1=$(awk '{print $2}' "$T/w/r1.ready")
tfd=$(ls -l /proc/"$r1"/fd | awk '/memfd:cuinterpose-ticket/ {print $9; exit}')
[ -n "$tfd" ] || fail "rank 1 (pid $r1) holds no ticket"
cat /proc/"$r1"/fd/"$tfd" >"$T/stolen"
chmod 0644 "$T/stolen"
grep -qa "$sock" "$T/stolen" || fail "the ticket does not name the creator's socket"
mkdir -p "$T/thief"
chown 65534:65534 "$T/thief"
steal() {
	$NOBODY env FAKECUDA_SOCKET="$T/thief/devd.sock" CUINTERPOSE_SOCKET_DIR="$T/thief/sock" \
		LD_PRELOAD="$SAN_PRELOAD$INTERPOSER" "$FAKERUN" "$THIEF" import "$T/stolen" >"$T/steal.out" 2>"$T/steal.err"
}
steal || fail "import of a stolen ticket succeeded: $(cat "$T/steal.out" "$T/steal.err")"
grep -q "^import: CUDA_ERROR" "$T/steal.out" || fail "stolen ticket: '$(cat "$T/steal.out" "$T/steal.err")'"
grep -q "cannot connect to the creator's socket $sock: Permission denied" "$T/steal.err" ||
	fail "stolen ticket: no refusal message: $(cat "$T/steal.err")"

note "socket mode loosened: SO_PEERCRED"
chmod 0666 "$sock"
out=$($NOBODY "$THIEF" connect "$sock") || fail "nobody was answered: $out"
[ "$out" = "connect: closed by peer" ] || fail "connect to a 0666 socket: '$out'"
steal || fail "import of a stolen ticket through a 0666 socket succeeded: $(cat "$T/steal.out" "$T/steal.err")"
grep -q "^import: CUDA_ERROR" "$T/steal.out" || fail "stolen ticket (0666): '$(cat "$T/steal.out" "$T/steal.err")'"
[ "$(grep -c "refusing control connection from pid [0-9]* uid 65534" "$T/job.log")" -ge 2 ] ||
	fail "the interposer did not log the refused peers: $(grep cuinterpose "$T/job.log" | tail -5)"
chmod 0600 "$sock"

note "criu as nobody"
mkdir -p "$T/nd"
chown 65534:65534 "$T/nd"
# criu itself (not the fake driver's wrapper) is what must refuse.
for mode in "" --unprivileged; do
	bounded $NOBODY env LD_LIBRARY_PATH="$B/test/fakecuda/.libs" "$CRIU" dump -t "$JOBPID" -D "$T/nd" \
		-L "$T/plugins" --shell-job -v4 -o dump.log $mode >"$T/nd.out" 2>&1 &&
		fail "criu dump $mode as nobody succeeded"
	grep -q "CRIU needs to have the CAP_SYS_ADMIN or the CAP_CHECKPOINT_RESTORE capability" "$T/nd.out" ||
		fail "criu dump $mode as nobody: $(cat "$T/nd.out")"
done
for p in $pids; do alive "$p" || fail "pid $p died after criu as nobody"; done
ls "$T"/nd/*.img >/dev/null 2>&1 && fail "criu as nobody wrote images: $(ls "$T/nd")"

note "the job is intact and still serves root"
cmd $N verify 0
[ "$(answers $N)" = "$before" ] || fail "addresses changed: $(answers $N) vs $before"
cmd $N write 2 1
cmd $N verify 1
"$CLI" inspect "$JOBPID" >"$T/inspect.root" || fail "inspect as root"
grep -q "ACTIVE" "$T/inspect.root" || fail "inspect as root: $(head -5 "$T/inspect.root")"
criu_dump "$T/d1" --leave-running || fail "criu dump as root after the attempts"
cmd $N verify 1
cmd $N exit
note done
