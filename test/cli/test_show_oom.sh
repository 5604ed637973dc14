#!/bin/sh
# test_show_oom.sh: `cuinterpose show` when memory runs out. The command is
# built again with the n-th allocation failing (cuinterpose-oom,
# test/harness/failalloc.h, armed by FAILALLOC_NTH), and run over a
# checkpoint with a flipped carrier byte once for every allocation a clean
# run makes: it must never call the damaged checkpoint OK (exit 0, "OK:"),
# and must never crash. Over the intact checkpoint every run says OK or
# names the memory that ran out, and never calls the bytes corrupt.
set -u
oom=$CUIP_CLI_OOM
T=$(mktemp -d "${TMPDIR:-/tmp}/cuip-show-oom.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; [ -f "$T/out" ] && cat "$T/out"; exit 1; }
CARRIER=cuinterpose-carrier-100.img

mkdir "$T/good" "$T/bad" && ./mkimages "$T/good" && ./mkimages "$T/bad" || fail "mkimages"
printf 'Z' | dd of="$T/bad/$CARRIER" bs=1 seek=16389 conv=notrunc 2>/dev/null

# allocations DIR: how many a clean run over DIR makes
allocations() {
	FAILALLOC_REPORT=1 "$oom" show "$1" >"$T/out" 2>&1
	sed -n 's/^failalloc: \([0-9]*\) allocations.*/\1/p' "$T/out" | tail -n 1
}

n_bad=$(allocations "$T/bad")
grep -q "^FAIL: 1 problem" "$T/out" || fail "the clean run over the damaged checkpoint"
n_good=$(allocations "$T/good")
grep -q "^OK: " "$T/out" || fail "the clean run over the intact checkpoint"
[ "${n_bad:-0}" -gt 0 ] && [ "${n_good:-0}" -gt 0 ] || fail "no allocation counted ($n_bad, $n_good)"

i=1
while [ $i -le "$n_bad" ]; do
	FAILALLOC_NTH=$i FAILALLOC_REPORT=1 "$oom" show "$T/bad" >"$T/out" 2>&1
	rc=$?
	[ $rc = 1 ] || [ $rc = 2 ] || fail "damaged checkpoint, allocation $i of $n_bad failing: exit $rc"
	grep -q "^OK: " "$T/out" && fail "damaged checkpoint called OK with allocation $i of $n_bad failing"
	grep -q "the armed one failed" "$T/out" || fail "allocation $i of $n_bad not reached"
	i=$((i + 1))
done

i=1
while [ $i -le "$n_good" ]; do
	FAILALLOC_NTH=$i "$oom" show "$T/good" >"$T/out" 2>&1
	rc=$?
	case $rc in
	0) grep -q "^OK: " "$T/out" || fail "intact checkpoint, allocation $i: exit 0 without OK" ;;
	1 | 2) grep -qi "out of memory\|cannot allocate" "$T/out" ||
		fail "intact checkpoint, allocation $i of $n_good failing: exit $rc without naming the memory" ;;
	*) fail "intact checkpoint, allocation $i of $n_good failing: exit $rc" ;;
	esac
	grep -q "CORRUPT\|corrupt:" "$T/out" && fail "intact checkpoint called corrupt with allocation $i failing"
	i=$((i + 1))
done
echo "PASS: show over a damaged checkpoint, $n_bad allocations each failing in turn: never OK;" \
	"over an intact one, $n_good: OK or out of memory, never corrupt"
