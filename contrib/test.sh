#!/usr/bin/env bash
# The whole test suite, from a fresh clone on Debian 12, as root:
#   installs the dependencies (contrib/install-deps.sh, idempotent), builds
#   out of tree in build/ and runs `make check`; then the same suite in
#   build-san/ under AddressSanitizer and UndefinedBehaviorSanitizer; then
#   `make distcheck`. Exits non-zero on the first failure.
# Set CUINTERPOSE_TEST_QUICK=1 to skip the sanitizer and distcheck passes.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)

bash "$top/contrib/install-deps.sh"
cd "$top"
[ -x configure ] && [ configure -nt configure.ac ] || ./autogen.sh >/dev/null

run_suite() {
	local dir=$1
	shift
	mkdir -p "$top/$dir"
	cd "$top/$dir"
	[ -f Makefile ] || "$top/configure" --quiet "$@"
	make -j"$jobs" >/dev/null
	if ! make -j"$jobs" check >"$top/$dir/check.out" 2>&1; then
		cat "$top/$dir/check.out"
		find . -name '*.log' -path '*test*' -newer Makefile -exec grep -l -E '^(FAIL|ERROR)' {} + 2>/dev/null |
			while read -r f; do echo "==== $f"; tail -n 60 "$f"; done
		return 1
	fi
	grep -E '^(PASS|SKIP|XFAIL|FAIL|ERROR):' "$top/$dir/check.out" || true
}

echo "== make check"
run_suite build
if [ "${CUINTERPOSE_TEST_QUICK:-0}" != 1 ]; then
	echo "== make check under ASan+UBSan"
	run_suite build-san --enable-asan --enable-ubsan
	echo "== make distcheck"
	cd "$top/build" && make -j"$jobs" distcheck >/dev/null
	echo "distcheck: passed"
	if echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
		clang -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
		echo "== libFuzzer smoke run (${CUINTERPOSE_FUZZ_SECONDS:-30} s)"
		make -s -C "$top/build/test/fuzz" fuzz FUZZ_SECONDS="${CUINTERPOSE_FUZZ_SECONDS:-30}" 2>&1 |
			grep -E '^(Done|stat::number_of_executed_units)|ERROR|crash' || true
		if ls "$top"/build/test/fuzz/crash-* >/dev/null 2>&1; then
			echo "libFuzzer found a crash: $(ls "$top"/build/test/fuzz/crash-*)"
			exit 1
		fi
	else
		echo "== libFuzzer smoke run skipped: clang cannot build -fsanitize=fuzzer here"
	fi
fi
# One summary line over every pass, counted from automake's result files.
count() {
	find "$top/build" "$top/build-san" -name '*.trs' -not -path '*/cuinterpose-*/*' -exec cat {} + 2>/dev/null |
		grep -c "^:test-result: $1" || true
}
echo "total: $(count PASS) passed, $(($(count FAIL) + $(count ERROR))) failed, $(count SKIP) skipped"
