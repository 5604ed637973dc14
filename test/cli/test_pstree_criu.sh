#!/bin/sh
# test_pstree_criu.sh: a pstree.img that real criu wrote, read by the reader
# `cuinterpose restore` uses (cli/pstreeread). criu dumps a small tree (a
# session leader with two children) with --leave-running and no plugin;
# the reader must find its root, the root's session, one entry per process
# and every pid. Needs root and criu (skips, exit 77, without them).
set -u
rd=$CUIP_PSTREEREAD
criu=$(command -v criu 2>/dev/null || { [ -x /usr/local/sbin/criu ] && echo /usr/local/sbin/criu; })
[ "$(id -u)" = 0 ] || { echo "SKIP: criu dump needs root"; exit 77; }
[ -n "$criu" ] || { echo "SKIP: no criu in PATH or /usr/local/sbin"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/cuip-pstree-criu.XXXXXX")
root=
trap '[ -n "$root" ] && kill $root $kids 2>/dev/null; rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; cat "$T/out" 2>/dev/null; exit 1; }
mkdir "$T/d" "$T/noplugins"

# The tree's root leads its own session: no --shell-job needed.
setsid sh -c 'sleep 120 & sleep 120 & wait' </dev/null >/dev/null 2>&1 &
root=$!
kids=
i=0
while [ $i -lt 100 ]; do
	kids=$(cat /proc/$root/task/$root/children 2>/dev/null)
	[ $(echo $kids | wc -w) = 2 ] && break
	sleep 0.05
	i=$((i + 1))
done
kids=$(echo $kids)
[ $(echo $kids | wc -w) = 2 ] || fail "the tree did not start two children (got '$kids')"
[ "$(ps -o sid= -p $root | tr -d ' ')" = $root ] || fail "setsid did not make $root a session leader"

timeout 60 "$criu" dump -t $root -D "$T/d" -L "$T/noplugins" --leave-running -v4 -o dump.log >"$T/out" 2>&1 ||
	{ tail -n 20 "$T/d/dump.log" >>"$T/out"; fail "criu dump failed"; }
"$rd" "$T/d/pstree.img" >"$T/out" 2>&1 || fail "criu's pstree.img does not decode"
[ "$(head -n 1 "$T/out")" = "root $root sid $root entries 3" ] || fail "expected 'root $root sid $root entries 3'"
got=$(sed -n 's/^ids //p' "$T/out" | tr ' ' '\n' | sort -n | tr '\n' ' ')
want=$(echo $root $kids | tr ' ' '\n' | sort -n | tr '\n' ' ')
[ "$got" = "$want" ] || fail "ids '$got', expected '$want'"
echo "PASS: criu's pstree.img of $root ($kids) decoded"
