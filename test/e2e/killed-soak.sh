#!/usr/bin/env bash
# killed-soak.sh - t-killed-anywhere.sh's sweep of criu kills (every fault
# point of a dump and a restore, then timed SIGKILLs over a measured dump
# and restore), ROUNDS times, with stress-ng loading the machine beside it
# (#45). Not part of make check: run it by hand, as root, from the top of
# the tree, after a build:
#
#   test/e2e/killed-soak.sh [-b BUILDDIR] [-n ROUNDS] [--no-load] [--keep-going]
#
# BUILDDIR defaults to build, ROUNDS to 20. The load is `stress-ng --cpu 2
# --io 1` (apt-get install -y stress-ng); --no-load runs without it. Every
# round's log is kept under $SOAK_DIR (default /tmp/killed-soak.PID); at the
# end a table gives, for each kill point (timed kills by the stage criu had
# reached), how many kills ended in each outcome. A failed round stops the
# soak unless --keep-going; its log holds the failure report.
# KILLED_FRACTIONS / KILLED_RANDOM pass through (timed kills per round).
set -u

BUILD=build
ROUNDS=20
LOAD=1
KEEP_GOING=0
while [ $# -gt 0 ]; do
	case $1 in
	-b) BUILD=$2; shift ;;
	-n) ROUNDS=$2; shift ;;
	--no-load) LOAD=0 ;;
	--keep-going) KEEP_GOING=1 ;;
	*) echo "usage: $0 [-b BUILDDIR] [-n ROUNDS] [--no-load] [--keep-going]" >&2; exit 2 ;;
	esac
	shift
done
TOP=$(cd "$(dirname "$0")/../.." && pwd)
case $BUILD in /*) ;; *) BUILD=$TOP/$BUILD ;; esac
[ -d "$BUILD/test/e2e" ] || { echo "no build in $BUILD (-b BUILDDIR)" >&2; exit 2; }
SOAK_DIR=${SOAK_DIR:-/tmp/killed-soak.$$}
mkdir -p "$SOAK_DIR"
TABLE=$SOAK_DIR/table
: >"$TABLE"

STRESS=
if [ $LOAD = 1 ]; then
	command -v stress-ng >/dev/null || { echo "stress-ng not installed (apt-get install -y stress-ng; or --no-load)" >&2; exit 2; }
	stress-ng --cpu 2 --io 1 --timeout 0 >"$SOAK_DIR/stress-ng.log" 2>&1 &
	STRESS=$!
	trap '[ -n "$STRESS" ] && kill "$STRESS" 2>/dev/null; wait 2>/dev/null' EXIT
fi

echo "soak: $ROUNDS rounds of t-killed-anywhere.sh, load: $([ $LOAD = 1 ] && echo "stress-ng --cpu 2 --io 1" || echo none), logs in $SOAK_DIR"
pass=0
failed=0
for ((i = 1; i <= ROUNDS; i++)); do
	t0=$(date +%s)
	make -s -C "$BUILD/test/e2e" check TESTS=t-killed-anywhere.sh KILLED_TABLE="$TABLE" \
		>"$SOAK_DIR/make.$i.out" 2>&1
	rc=$?
	cp "$BUILD/test/e2e/t-killed-anywhere.log" "$SOAK_DIR/round.$i.log" 2>/dev/null
	kills=$(grep -c "^iteration [0-9]*:" "$SOAK_DIR/round.$i.log" 2>/dev/null)
	if [ $rc = 0 ]; then
		pass=$((pass + 1))
		echo "round $i: PASS, $kills kills, $(($(date +%s) - t0)) s"
	else
		failed=$((failed + 1))
		echo "round $i: FAIL after $kills kills, $(($(date +%s) - t0)) s: $(grep -m1 "^FAIL: " "$SOAK_DIR/round.$i.log")"
		[ $KEEP_GOING = 1 ] || break
	fi
done

echo
echo "kills by point and outcome ($(wc -l <"$TABLE") kills, $pass rounds passed, $failed failed)"
# timed kills grouped by the stage criu had reached (the delay dropped)
sed -E 's#^(timed) (restore:)?[^@ ]*@#\1 \2@#' "$TABLE" | sort | uniq -c |
	awk '{ printf "%5d  %-6s %-44s %s\n", $1, $2, $3, $4 }'
[ $failed = 0 ]
