#!/bin/sh
# bounded.sh - nothing the scripts run waits forever.
#
# contrib/bounded (every criu call of the demo, the tests and the GPU
# scripts runs under it): a command's own exit status passes through; a
# command past its bound is killed, exits 124 and is named on stderr with
# criu's log (-W or -D, and -o); a command killed by another process
# before its bound keeps its status (137) without that message; a bad call is a usage error (2). Then the
# source check: every line of the project's scripts that starts criu dump,
# restore or pre-dump runs it through bounded (or the GPU suite's criu_do,
# which does). Run by `make check` in test/unit with top_srcdir set.
set -u
: "${top_srcdir:?run through make check}"
B=$top_srcdir/contrib/bounded
T=$(mktemp -d /tmp/cuip-bounded.XXXXXX)
trap 'rm -rf "$T"' EXIT
bad=0
no() { echo "FAIL: $*"; bad=1; }

"$B" 5 sh -c 'exit 3'
[ $? = 3 ] || no "exit status 3 did not pass through"
"$B" 5 true || no "a command that succeeds failed"

mkdir "$T/bin"
printf '#!/bin/sh\nexec sleep 30\n' >"$T/bin/criu"
chmod +x "$T/bin/criu"
start=$(date +%s)
"$B" 1 "$T/bin/criu" restore -D "$T/img" -o restore.log --shell-job 2>"$T/err"
rc=$?
[ $rc = 124 ] || no "a hung criu exited $rc, not 124"
[ $(($(date +%s) - start)) -lt 15 ] || no "a hung criu was not stopped near its bound"
grep -qx "bounded: \"$T/bin/criu restore -D $T/img -o restore.log --shell-job\" did not finish within 1 s and was killed: it hung; its log: $T/img/restore.log" "$T/err" ||
	no "message for a hung criu: $(cat "$T/err")"
"$B" 1 env A=1 "$T/bin/criu" dump -D "$T/img" -W "$T/work" -o /abs/dump.log 2>"$T/err"
grep -q "its log: /abs/dump.log$" "$T/err" || no "an absolute -o: $(cat "$T/err")"
"$B" 1 "$T/bin/criu" dump -D "$T/img" -W "$T/work" -o dump.log 2>"$T/err"
grep -q "its log: $T/work/dump.log$" "$T/err" || no "-W names the log's directory: $(cat "$T/err")"
"$B" 1 sleep 30 2>"$T/err"
grep -qx 'bounded: "sleep 30" did not finish within 1 s and was killed: it hung' "$T/err" ||
	no "message for another command: $(cat "$T/err")"

# killed by someone else well before its bound (a test's SIGKILL of criu):
# its own status, 137, and no word of a hang
mkdir "$T/bin2"
printf '#!/bin/sh\necho $$ >"%s/pid"\nexec sleep 30\n' "$T" >"$T/bin2/criu"
chmod +x "$T/bin2/criu"
"$B" 60 "$T/bin2/criu" restore -D "$T/img" -o restore.log 2>"$T/err" &
bpid=$!
c=
for _ in $(seq 200); do
	c=$(cat "$T/pid" 2>/dev/null)
	[ -n "$c" ] && break
	sleep 0.05
done
[ -n "$c" ] || no "the command under bounded did not start"
start=$(date +%s)
kill -9 "$c"
wait $bpid
rc=$?
[ $rc = 137 ] || no "a criu SIGKILLed by another process exited $rc, not 137"
[ $(($(date +%s) - start)) -lt 15 ] || no "bounded waited on after its command was killed"
grep -q "did not finish" "$T/err" && no "a killed command reported as hung: $(cat "$T/err")"

"$B" 2>/dev/null
[ $? = 2 ] || no "no arguments: not a usage error"
"$B" soon true 2>/dev/null
[ $? = 2 ] || no "a bound that is not a number: not a usage error"

cd "$top_srcdir" || exit 1
unbounded=$(grep -rn -E '"\$\{?CRIU\}?" +(dump|restore|pre-dump)|\]\}?"? +criu +(dump|restore|pre-dump)|^[[:space:]]*criu +(dump|restore|pre-dump)' \
	--include='*.sh' contrib test | grep -v -E 'bounded|BOUNDED|criu_do')
[ -z "$unbounded" ] || no "criu started without a bound (contrib/bounded):
$unbounded"
[ $bad = 0 ] && echo "PASS: bounded passes exit codes, stops and names hung commands; every criu call is bounded"
exit $bad
