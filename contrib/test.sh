#!/usr/bin/env bash
# The whole test suite, from a fresh clone on Debian 12, as root:
#   installs the dependencies (contrib/install-deps.sh, idempotent), builds
#   out of tree in build/ and runs `make check`; then the same suite in
#   build-san/ under AddressSanitizer and UndefinedBehaviorSanitizer; then
#   `make distcheck` (the tarball holds every tracked file, builds, installs
#   and passes the unit suites; the slow suites ran above). Exits non-zero on the first failure, and when a test
#   skipped that test/expected-skips does not list for that pass with the
#   reason it printed (a machine where criu cannot run must not pass green).
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
			while read -r f; do
				# the verdict and the step first: the tail below may hold
				# only the report's logs
				echo "==== $f: $(grep -m 3 -E '^(FAIL|step:|waiting for:)' "$f" | tr '\n' ' ')"
				tail -n 60 "$f"
			done
		return 1
	fi
	grep -E '^(PASS|SKIP|XFAIL|FAIL|ERROR):' "$top/$dir/check.out" || true
}

# expected_skip PASS TEST REASON: whether test/expected-skips allows it.
expected_skip() {
	local pass=$1 test=$2 reason=$3 p t re
	while read -r p t re; do
		case $p in '' | '#'*) continue ;; esac
		# shellcheck disable=SC2053
		[ "$p" = "$pass" ] && [[ $test == $t ]] && [[ $reason =~ $re ]] && return 0
	done <"$top/test/expected-skips"
	return 1
}

# check_skips DIR PASS: every skipped test of the pass printed a reason that
# test/expected-skips expects; the others are listed and fail the run.
check_skips() {
	local dir=$1 pass=$2 trs name reason bad=0
	while read -r trs; do
		name=$(basename "${trs%.trs}")
		reason=$(grep -m1 '^SKIP: ' "${trs%.trs}.log" 2>/dev/null || true)
		reason=${reason#SKIP: }
		expected_skip "$pass" "$name" "${reason:-(no reason printed)}" && continue
		echo "unexpected skip in the $pass pass: $name: ${reason:-(no reason printed)} (${trs%.trs}.log)"
		bad=1
	done < <(find "$top/$dir" -name '*.trs' -not -path '*/cuinterpose-*/*' -exec grep -l '^:test-result: SKIP' {} +)
	[ $bad = 0 ] || echo "FAIL: tests skipped that must run on this machine (test/expected-skips lists the allowed ones)"
	return $bad
}

# criu_works: criu dumps and restores a plain process here, within bounds.
# Fails fast, naming criu's log, where every end-to-end test would fail.
criu_works() {
	local d pid v
	d=$(mktemp -d /tmp/cuip-criu-probe.XXXXXX)
	mkdir "$d/img" "$d/plugins" # no plugin: this is about criu alone
	setsid sleep 600 </dev/null >/dev/null 2>&1 &
	pid=$!
	v=$(criu --version | sed -n 's/^Version: *//p')
	# The shell's own stderr is /dev/null while the dump runs (the dump's
	# goes to the real one): bash reports the sleep that the dump ends
	# ("Killed") when the dump returns, which is no error here.
	if ! { "$top/contrib/bounded" 60 criu dump -t "$pid" -D "$d/img" -L "$d/plugins" -o dump.log -v4 2>&3; } \
		3>&2 2>/dev/null; then
		kill -9 "$pid" 2>/dev/null
		echo "FAIL: criu $v cannot dump a plain process (sleep) on this machine; see $d/img/dump.log:"
		tail -n 5 "$d/img/dump.log"
		return 1
	fi
	wait "$pid" 2>/dev/null || : # reap it (killed by the dump): the restore needs its pid
	if ! "$top/contrib/bounded" 60 criu restore -D "$d/img" -L "$d/plugins" -d -o restore.log -v4 ||
		! kill -0 "$pid" 2>/dev/null; then
		echo "FAIL: criu $v cannot restore a plain process (sleep) on this machine; see $d/img/restore.log:"
		tail -n 5 "$d/img/restore.log"
		return 1
	fi
	kill -9 "$pid" 2>/dev/null || :
	rm -rf "$d"
	echo "criu $v: dumps and restores a plain process here"
}

criu_works
echo "== make check"
run_suite build
check_skips build plain
if [ "${CUINTERPOSE_TEST_QUICK:-0}" != 1 ]; then
	echo "== make check under ASan+UBSan"
	run_suite build-san --enable-asan --enable-ubsan
	check_skips build-san asan
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
