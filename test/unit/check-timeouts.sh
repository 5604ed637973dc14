#!/bin/sh
# check-timeouts.sh - every Check test case in the tree sets its timeout.
#
# Check stops a test after 4 s unless told otherwise; sanitizer builds run
# 2x slower and CI machines are loaded, so a test that relies on the default
# fails there and nowhere else. Each source that creates test cases must set
# as many timeouts (tcase_set_timeout) as it creates cases (tcase_create).
# Run by `make check` in test/unit with top_srcdir set.
set -u
: "${top_srcdir:?run through make check}"
cd "$top_srcdir" || exit 1
bad=0
n=0
for f in $(grep -rl --include='*.c' 'tcase_create(' plugin test protocol carrier interposer 2>/dev/null | sort); do
	created=$(grep -o 'tcase_create(' "$f" | wc -l)
	timed=$(grep -o 'tcase_set_timeout(' "$f" | wc -l)
	n=$((n + 1))
	if [ "$timed" -lt "$created" ]; then
		echo "FAIL: $f creates $created test case(s) but sets $timed timeout(s) (tcase_set_timeout)"
		bad=1
	fi
done
[ "$n" -gt 0 ] || { echo "FAIL: no Check sources found under $top_srcdir"; exit 1; }
if grep -rn --include='Makefile.am' 'CK_DEFAULT_TIMEOUT' . >/dev/null; then
	grep -rn --include='Makefile.am' 'CK_DEFAULT_TIMEOUT' .
	echo "FAIL: a Makefile.am sets CK_DEFAULT_TIMEOUT, hiding test cases without their own timeout"
	bad=1
fi
[ $bad = 0 ] && echo "PASS: $n Check sources, every test case sets its timeout"
exit $bad
