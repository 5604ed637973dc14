#!/bin/sh
# documented-env.sh - every CUINTERPOSE_* variable the code reads is
# documented in README.md and in the man page (cli/cuinterpose.1).
#
# Variables are read by getenv() or by the option helpers (env_uint,
# env_bool, env_str in plugin/options.c, env_num in carrier/config.c),
# always with the name as a whole string literal, so every whole literal
# "CUINTERPOSE_..." in the C sources counts; the contrib scripts read theirs
# as ${CUINTERPOSE_...}. A name built at run time (no literal) would escape
# this check: the last part fails if any getenv() takes a non-literal name
# that mentions CUINTERPOSE. Run by `make check` with top_srcdir set.
set -u
: "${top_srcdir:?run through make check}"
cd "$top_srcdir" || exit 1
readme=README.md
man=cli/cuinterpose.1
names=$({
	grep -rhoE '"CUINTERPOSE_[A-Z0-9_]+"' --include='*.c' --include='*.h' plugin interposer protocol carrier cli | tr -d '"'
	grep -hoE '\$\{?CUINTERPOSE_[A-Z0-9_]+' contrib/*.sh | tr -d '${'
} | sort -u)
[ -n "$names" ] || { echo "FAIL: found no CUINTERPOSE_ variable in the sources"; exit 1; }
bad=0
for v in $names; do
	grep -q "\`$v\`" "$readme" || { echo "FAIL: $v is read by the code but not documented in $readme"; bad=1; }
	grep -q "$v" "$man" || { echo "FAIL: $v is read by the code but not documented in $man"; bad=1; }
done
if grep -rnE 'getenv\([^")]*CUINTERPOSE' --include='*.c' plugin interposer protocol carrier cli; then
	echo "FAIL: a CUINTERPOSE variable is read through a computed name; this check cannot see it"
	bad=1
fi
[ $bad = 0 ] && echo "PASS: $(echo "$names" | wc -l) variables, each in $readme and $man:" $names
exit $bad
