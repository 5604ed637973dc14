#!/bin/sh
# dist-complete.sh - contrib/dist-complete.sh, make distcheck's hook: on a
# scratch git repository, a tarball tree that holds every tracked file
# passes (exit 0); one missing a tracked file fails (exit 1) naming the
# file; .gitignore need not be shipped; a source tree that is no checkout
# (a build from the tarball) has nothing to compare (exit 0, says so).
# Run by `make check` in test/unit with top_srcdir set.
set -u
: "${top_srcdir:?run through make check}"
D=$top_srcdir/contrib/dist-complete.sh
command -v git >/dev/null || { echo "SKIP: git not installed"; exit 77; }
T=$(mktemp -d /tmp/cuip-distc.XXXXXX)
trap 'rm -rf "$T"' EXIT
bad=0
no() { echo "FAIL: $*"; bad=1; }

mkdir -p "$T/src/sub" "$T/dist/sub"
git -C "$T/src" init -q
echo a >"$T/src/a.c"
echo b >"$T/src/sub/b.sh"
echo '*.o' >"$T/src/.gitignore"
git -C "$T/src" add a.c sub/b.sh .gitignore
cp "$T/src/a.c" "$T/dist/"

out=$(bash "$D" "$T/src" "$T/dist" 2>&1)
[ $? = 1 ] || no "a tarball missing sub/b.sh passed: $out"
echo "$out" | grep -q "^dist-complete: tracked but not in the tarball: sub/b.sh$" || no "sub/b.sh not named: $out"
echo "$out" | grep -q "a.c$" && no "a.c named although shipped: $out"
echo "$out" | grep -q "gitignore" && no ".gitignore asked for: $out"
echo "$out" | grep -q "FAIL: 1 tracked file(s) missing" || no "no summary: $out"

cp "$T/src/sub/b.sh" "$T/dist/sub/"
out=$(bash "$D" "$T/src" "$T/dist" 2>&1)
[ $? = 0 ] || no "a complete tarball failed: $out"
[ "$out" = "dist-complete: every tracked file is in the tarball" ] || no "complete tarball said: $out"

mkdir "$T/plain"
out=$(bash "$D" "$T/plain" "$T/dist" 2>&1)
[ $? = 0 ] || no "a source tree outside git failed: $out"
echo "$out" | grep -q "is not a git checkout: nothing to compare" || no "outside git said: $out"
exit $bad
