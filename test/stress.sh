#!/usr/bin/env bash
# stress.sh - run the test suite, or any part of it, several times under CPU
# and I/O load, to find the tests that only pass on an idle machine.
#
#   test/stress.sh [-n RUNS] [-c CPU] [-i IO] [-d HDD] [-t SECONDS] [-l DIR]... [-- COMMAND...]
#
# Runs COMMAND (default: ./contrib/test.sh, the README's test command) RUNS
# times (default 3) from the top of the tree while stress-ng loads the
# machine: CPU workers spinning (-c, default 2), I/O workers calling sync()
# (-i, default 1) and, when asked, disk writers (-d, default 0). Each run is
# bounded (-t, default 3600 s: the command is killed past it and the run
# fails); the load starts before each run and is stopped after it (and on any
# exit of this script). A failed run prints the tail of its output and the
# log of every test that failed in it (the *.log beside each automake .trs
# result that says FAIL or ERROR, written during the run, found in the -l
# directories: by default those the command names with -C, else build/ and
# build-san/, where contrib/test.sh builds). The last line is
# the summary: "stress: 3 runs, 3 passed, 0 failed". Exits 0 when every run
# passed. Needs stress-ng (contrib/install-deps.sh installs it). Example:
#   test/stress.sh -n 3 -- make -C build check TESTS='t-precopy.sh t-killed-frozen.sh'
# (TESTS names files relative to each directory make descends into: run it
# in the directory of the tests, e.g. make -C build/test/e2e check TESTS=...).
set -u
runs=3 cpu=2 io=1 hdd=0 limit=3600 logdirs=()
usage() {
	sed -n 's/^#   //p' "$0" | head -1 >&2
	exit 2
}
while getopts n:c:i:d:t:l:h opt; do
	case $opt in
	n) runs=$OPTARG ;;
	c) cpu=$OPTARG ;;
	i) io=$OPTARG ;;
	d) hdd=$OPTARG ;;
	t) limit=$OPTARG ;;
	l) logdirs+=("$OPTARG") ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
for v in "$runs" "$cpu" "$io" "$hdd" "$limit"; do [[ $v =~ ^[0-9]+$ ]] || usage; done
top=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] || set -- ./contrib/test.sh
if [ ${#logdirs[@]} = 0 ]; then
	prev=
	for a in "$@"; do
		[ "$prev" = -C ] && logdirs+=("$a")
		prev=$a
	done
	[ ${#logdirs[@]} -gt 0 ] || logdirs=(build build-san)
fi
command -v stress-ng >/dev/null || {
	echo "stress: stress-ng is not installed (contrib/install-deps.sh installs it)" >&2
	exit 2
}
out=$(mktemp -d /tmp/cuip-stress.XXXXXX)
load=

# The load runs in a session of its own: stopping it ends every worker.
start_load() {
	local args=()
	[ "$cpu" -gt 0 ] && args+=(--cpu "$cpu")
	[ "$io" -gt 0 ] && args+=(--io "$io")
	[ "$hdd" -gt 0 ] && args+=(--hdd "$hdd" --hdd-bytes 256M --temp-path "$out")
	[ ${#args[@]} -gt 0 ] || return 0
	# its own bound too: a run's limit and a minute, should this script die
	setsid stress-ng "${args[@]}" --timeout $((limit + 60))s --quiet </dev/null >"$out/load.log" 2>&1 &
	load=$!
}
stop_load() {
	local i
	[ -n "$load" ] || return 0
	kill -TERM -- -"$load" 2>/dev/null
	for ((i = 0; i < 100; i++)); do
		kill -0 -- -"$load" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL -- -"$load" 2>/dev/null
	wait "$load" 2>/dev/null
	load=
}
# The command runs in the background, waited for: a signal to this script
# then stops it and the load at once (bash runs a trap only after a
# foreground command ends). timeout relays the signal to the command.
cmdpid=
interrupted() {
	[ -n "$cmdpid" ] && kill -TERM "$cmdpid" 2>/dev/null && wait "$cmdpid" 2>/dev/null
	exit 130
}
trap 'stop_load' EXIT
trap 'interrupted' INT TERM

# failed_logs STAMP: the log of every automake test that failed since STAMP
failed_logs() {
	(cd "$top" && find "${logdirs[@]}" -name '*.trs' -newer "$1" -not -path '*/cuinterpose-*/*' \
		-exec grep -l -E '^:test-result: (FAIL|ERROR)' {} + 2>/dev/null) |
		while read -r trs; do
			echo "==== ${trs%.trs}.log"
			tail -n 200 "$top/${trs%.trs}.log" 2>/dev/null
		done
}

passed=0 failed=0
cd "$top" || exit 2
for ((run = 1; run <= runs; run++)); do
	stamp=$out/run$run.stamp
	: >"$stamp"
	start_load
	echo "stress: run $run of $runs: $* (load: --cpu $cpu --io $io --hdd $hdd; bound $limit s)"
	t0=$SECONDS
	timeout -k 30 "$limit" "$@" </dev/null >"$out/run$run.out" 2>&1 &
	cmdpid=$!
	wait "$cmdpid"
	rc=$?
	cmdpid=
	stop_load
	if [ $rc = 0 ]; then
		passed=$((passed + 1))
		echo "stress: run $run passed ($((SECONDS - t0)) s)"
		continue
	fi
	failed=$((failed + 1))
	why="exit status $rc"
	[ $rc = 124 ] || [ $rc = 137 ] && why="killed after its bound of $limit s"
	echo "stress: run $run FAILED ($why, $((SECONDS - t0)) s); its output's last 60 lines ($out/run$run.out):"
	tail -n 60 "$out/run$run.out"
	failed_logs "$stamp"
done
echo "stress: $runs runs, $passed passed, $failed failed (outputs in $out)"
[ $failed = 0 ]
