#!/bin/sh
# test_usage.sh: what `cuinterpose` says about bad input, --version and
# --help. Each bad input gets exit 2 (1 for a process that does not exist or
# has no interposer, and for what checkpoint/restore find missing before
# criu runs) and one line naming what is wrong with it; --help lists every
# option each subcommand accepts. No root, CRIU or driver needed.
set -u
cli=$CUIP_CLI
T=$(mktemp -d "${TMPDIR:-/tmp}/cuip-usage.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; cat "$T/out"; exit 1; }
# expect RC PATTERN ARGS...: exit status and a line of stdout+stderr
expect() {
	rc=$1 pat=$2
	shift 2
	"$cli" "$@" >"$T/out" 2>&1
	got=$?
	[ "$got" = "$rc" ] || fail "cuinterpose $*: exit $got, expected $rc"
	grep -qE -- "$pat" "$T/out" || fail "cuinterpose $*: no line matching '$pat'"
}

expect 0 "^cuinterpose [0-9]+\.[0-9]+\.[0-9]+$" --version
expect 1 "^cuinterpose inspect: no such process: 999999$" inspect 999999
expect 2 "^cuinterpose inspect: 'notapid' is not a PID" inspect notapid
expect 2 "^cuinterpose inspect: '-5' is not a PID" inspect -5
expect 2 "^cuinterpose inspect: '12x' is not a PID" inspect 12x
expect 2 "^cuinterpose inspect: one PID at a time \('2' after 1\)" inspect 1 2
expect 2 "^cuinterpose inspect: unknown option '--bogus'" inspect --bogus
expect 2 "^cuinterpose inspect: no PID given" inspect
expect 2 "^cuinterpose inspect: --wait needs a number of seconds .*got 'x'" inspect 1 --wait x
expect 2 "^cuinterpose inspect: --wait needs a number of seconds .*got nothing" inspect 1 --wait
# a live process without the interposer: no socket, said at once or after --wait
sleep 30 &
sl=$!
expect 1 "process $sl has no cuinterpose control socket.*--wait SECONDS waits for it" inspect $sl
start=$(date +%s)
expect 1 "process $sl has no cuinterpose control socket.*after --wait" inspect $sl --wait 1
[ $(($(date +%s) - start)) -ge 1 ] || fail "--wait 1 returned before a second"
# --wait gives up as soon as the process is gone
kill $sl
wait $sl 2>/dev/null
expect 1 "no such process: $sl" inspect $sl --wait 30

expect 2 "^cuinterpose check: --pid needs a PID .*got nothing" check --pid
expect 2 "^cuinterpose check: --pid needs a PID .*got 'abc'" check --pid abc
expect 2 "^cuinterpose check: --pid needs a PID .*got '7z'" check --pid 7z
expect 2 "^cuinterpose check: --libdir needs a directory" check --libdir
expect 2 "^cuinterpose check: --criu needs a path" check --criu
expect 2 "^cuinterpose check: unknown option '--bogus'" check --bogus
expect 2 "^cuinterpose check: unexpected argument 'extra'" check extra
expect 2 "^cuinterpose show: no DIR given" show
expect 2 "^cuinterpose show: unknown option '-x'" show -x
expect 2 "^cuinterpose show: one DIR at a time \('b' after a\)" show a b
expect 2 "^cuinterpose run: --lib needs a PATH" run --lib
expect 2 "^cuinterpose run: unknown option '--x' \(put the command after --\)" run --x
expect 2 "^cuinterpose run: no command given" run
expect 2 "^cuinterpose checkpoint: no PID given" checkpoint
expect 2 "^cuinterpose checkpoint: no DIR given" checkpoint 1
expect 2 "^cuinterpose checkpoint: '12x' is not a PID" checkpoint 12x "$T/d"
expect 2 "^cuinterpose checkpoint: '0' is not a PID" checkpoint 0 "$T/d"
expect 2 "^cuinterpose checkpoint: unexpected argument 'c' \(criu's own arguments go after --\)" checkpoint 1 "$T/d" c
expect 2 "^cuinterpose checkpoint: unknown option '--leave-running' \(criu's own options go after --\)" \
	checkpoint --leave-running 1 "$T/d"
expect 2 "^cuinterpose checkpoint: --timeout needs a number of seconds \(1 \.\. 604800\), got 'x'" \
	checkpoint --timeout x 1 "$T/d"
expect 2 "^cuinterpose checkpoint: --timeout needs a number of seconds \(1 \.\. 604800\), got '0'" \
	checkpoint --timeout 0 1 "$T/d"
expect 2 "^cuinterpose checkpoint: --timeout needs a number of seconds" checkpoint 1 "$T/d" --timeout
expect 2 "^cuinterpose checkpoint: --libdir needs a directory" checkpoint 1 "$T/d" --libdir
expect 2 "^cuinterpose checkpoint: --criu needs a path to the criu binary" checkpoint 1 "$T/d" --criu
expect 2 "^cuinterpose checkpoint: unknown option '--reap'" checkpoint --reap 1 "$T/d"
expect 0 "^usage: cuinterpose checkpoint .*PID DIR \[-- CRIU-ARGS\.\.\.\]" checkpoint --help
# a process that does not exist: 1, said before criu runs, no DIR made
expect 1 "^cuinterpose checkpoint: no such process: 999999$" checkpoint 999999 "$T/d"
[ -e "$T/d" ] && fail "checkpoint of no process made its directory"
# the plugin is looked for before criu runs
expect 1 "^cuinterpose checkpoint: $T/cuinterpose_plugin.so: No such file or directory; .*--libdir" \
	checkpoint --libdir "$T" --criu /bin/true $$ "$T/d"
expect 1 "^cuinterpose checkpoint: --criu is not an executable" checkpoint --criu "$T/nocriu" $$ "$T/d"
expect 2 "^cuinterpose precopy: no PID given" precopy
expect 2 "^cuinterpose precopy: no DIR given" precopy 1
expect 2 "^cuinterpose precopy: 'x1' is not a PID" precopy x1 "$T/p"
expect 2 "^cuinterpose precopy: unexpected argument 'c'" precopy 1 "$T/p" c
expect 2 "^cuinterpose precopy: unknown option '--bogus'" precopy --bogus 1 "$T/p"
expect 2 "^cuinterpose precopy: --timeout needs a number of seconds \(1 \.\. 86400\), got 'x'" precopy --timeout x 1 "$T/p"
expect 2 "^cuinterpose precopy: --timeout needs a number of seconds \(1 \.\. 86400\), got nothing" precopy 1 "$T/p" --timeout
(
	CUINTERPOSE_TEST_CHUNK_SIZE=12
	export CUINTERPOSE_TEST_CHUNK_SIZE
	expect 2 "^cuinterpose precopy: CUINTERPOSE_TEST_CHUNK_SIZE=12: want bytes, 4096 \.\. 1073741824" precopy 1 "$T/p"
) || exit 1
expect 0 "^usage: cuinterpose precopy \[--timeout SECONDS\] PID DIR" precopy --help
expect 1 "^cuinterpose precopy: no such process: 999999$" precopy 999999 "$T/p"
[ -e "$T/p" ] && fail "precopy of no process made its directory"
expect 2 "^cuinterpose restore: no DIR given" restore
expect 2 "^cuinterpose restore: no DIR given" restore --reap -- --tcp-established
expect 2 "^cuinterpose restore: unexpected argument 'b' \(criu's own arguments go after --\)" restore a b
expect 2 "^cuinterpose restore: unknown option '--shell-job' \(criu's own options go after --\)" \
	restore --shell-job "$T"
expect 2 "^cuinterpose restore: --timeout needs a number of seconds \(1 \.\. 604800\), got '-1'" \
	restore --timeout -1 "$T"
expect 2 "^cuinterpose restore: --libdir needs a directory" restore "$T" --libdir
expect 0 "^usage: cuinterpose restore .*\[--reap\] DIR \[-- CRIU-ARGS\.\.\.\]" restore --help
# not an image directory: 1, before criu runs
: >"$T/cuinterpose_plugin.so"
expect 1 "^cuinterpose restore: cannot read $T/pstree.img: No such file or directory; is $T a criu image directory\?" \
	restore --libdir "$T" --criu /bin/true "$T"
printf 'not an image' >"$T/pstree.img"
expect 1 "^cuinterpose restore: cannot read $T/pstree.img: Invalid argument" restore --libdir "$T" --criu /bin/true "$T"
expect 1 "^cuinterpose restore: $T/nodir: No such file or directory" restore --libdir "$T" --criu /bin/true "$T/nodir"

# The option loop (getopt_long) of every subcommand: a value joined with '=',
# a missing one, a bad one, an option that takes none given one, and "--"
# where no pass-through exists each get the subcommand's own line, exit 2.
expect 2 "^cuinterpose inspect: --wait needs a number of seconds .*got 'x'" inspect --wait=x 1
expect 2 "^cuinterpose inspect: unknown option '--json=1'" inspect --json=1 1
expect 2 "^cuinterpose inspect: '-5x' is not a PID" inspect -5x
expect 2 "^cuinterpose inspect: unknown option '--'$" inspect -- 1
expect 2 "^cuinterpose check: --pid needs a PID .*got '0'" check --pid=0
expect 2 "^cuinterpose check: --libdir needs a directory" check --lib
expect 2 "^cuinterpose check: unknown option '-'" check -
expect 2 "^cuinterpose check: unknown option '--'$" check --
expect 2 "^cuinterpose show: unknown option '--no-verify=x'" show --no-verify=x "$T"
expect 2 "^cuinterpose show: unknown option '--'$" show -- "$T"
expect 2 "^cuinterpose precopy: --timeout needs a number of seconds \(1 \.\. 86400\), got '0'" precopy --timeout=0 1 "$T/p"
expect 2 "^cuinterpose precopy: unknown option '-x'" precopy -x 1 "$T/p"
expect 2 "^cuinterpose precopy: unknown option '--'$" precopy 1 "$T/p" --
expect 2 "^cuinterpose options: unknown argument '--bogus'" options --bogus
expect 2 "^cuinterpose options: unknown argument 'x'" options x
expect 2 "^cuinterpose options: unknown argument '--'$" options --
expect 0 "^usage: cuinterpose options \[--all\] \[--check\]" options --help
expect 2 "^cuinterpose run: unknown option '-x' \(put the command after --\)" run -x true
expect 2 "^cuinterpose run: no command given" run --
expect 2 "^cuinterpose run: unknown option '-' \\(put the command after --\\)" run -
expect 1 "^cuinterpose run: libcuinterpose.so not found \($T/nolib\); check the --lib path" run --lib="$T/nolib" true
expect 2 "^cuinterpose checkpoint: --timeout needs a number of seconds$" checkpoint --timeout= 1 "$T/d"
expect 2 "^cuinterpose checkpoint: --libdir needs a directory" checkpoint --libdir "" 1 "$T/d"
expect 2 "^cuinterpose checkpoint: unknown option '-x' \(criu's own options go after --\)" checkpoint -x 1 "$T/d"
expect 2 "^cuinterpose restore: --criu needs a path to the criu binary" restore "$T" --criu
expect 2 "^cuinterpose restore: unknown option '--reap=1'" restore --reap=1 "$T"
# run: CMD's own options are CMD's, with or without "--"
expect 0 "^x --lib -h$" run --lib "$CUIP_LIB" -- sh -c 'echo "$0 $1 $2"' x --lib -h
expect 0 "^y --help$" run --lib "$CUIP_LIB" sh -c 'echo "$0 $1"' y --help
# checkpoint: what follows the first "--" reaches criu as it was, in order
: >"$T/cuinterpose_plugin.so"
printf '#!/bin/sh\nfor a in "$@"; do printf "[%%s]\\n" "$a"; done >"%s/criu.args"\n' "$T" >"$T/criu"
chmod +x "$T/criu"
# The root leads a session of its own: this shell's session may be led from
# outside its pid namespace (CI), which checkpoint refuses before criu runs.
setsid sleep 60 &
sj=$!
n=0
until [ "$(ps -o sid= -p "$sj" | tr -d ' ')" = "$sj" ]; do
	n=$((n + 1))
	[ $n -le 100 ] || { kill $sj; fail "setsid sleep did not lead a session of its own within 10 s"; }
	sleep 0.1
done
"$cli" checkpoint --libdir "$T" --criu "$T/criu" --timeout 30 $sj "$T/pt" -- --help -h -- 'a b' --timeout \
	>"$T/out" 2>&1 || { kill $sj; fail "checkpoint with a fake criu failed"; }
kill $sj
tail -n 5 "$T/criu.args" | tr -d '\n' >"$T/tail"
[ "$(cat "$T/tail")" = "[--help][-h][--][a b][--timeout]" ] || fail "criu got '$(cat "$T/tail")' after the flags"

expect 2 "^cuinterpose: unknown command 'bogus'" bogus
expect 2 "^cuinterpose: unknown option '--bogus'" --bogus

# --help names every option of every subcommand
"$cli" --help >"$T/out" 2>&1 || fail "--help exits non-zero"
for o in "run \[--lib PATH\]" "inspect PID \[--json\] \[--wait SECONDS\]" "show DIR \[--json\] \[--no-verify\]" \
	"--libdir DIR" "--criu PATH" "--criu-check" "--pid PID" "--no-processes" "--version" \
	"checkpoint \[--libdir DIR\] \[--criu PATH\] \[--timeout SECONDS\] PID DIR \[-- CRIU-ARGS...\]" \
	"restore \[--libdir DIR\] \[--criu PATH\] \[--timeout SECONDS\] \[--reap\] DIR \[-- CRIU-ARGS...\]"; do
	grep -qE -- "$o" "$T/out" || fail "--help does not list '$o'"
done
echo "PASS: usage messages, --version, --help"
