#!/bin/sh
# carrier-bench.sh [BENCH [ARGS...]]: run the host-carrier benchmark
# (carrier-bench -h lists ARGS) on the real driver when one is installed,
# else on the fake driver of the build tree (test/fakecuda/fakecuda-run).
# CARRIER_BENCH_DRIVER=real|fake forces the choice. Fake-driver numbers only
# exercise the pipeline: its "device" is memory shared with a helper process
# and its copies run on one worker thread.
set -e
bench=${1:-./carrier-bench}
[ $# -gt 0 ] && shift
driver=${CARRIER_BENCH_DRIVER:-auto}
if [ "$driver" = auto ]; then
	if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
		driver=real
	else
		driver=fake
	fi
fi
if [ "$driver" = fake ]; then
	run=$(cd "$(dirname "$bench")/../fakecuda" && pwd)/fakecuda-run
	[ -x "$run" ] || { echo "carrier-bench.sh: no $run: make -C test/fakecuda first" >&2; exit 1; }
	# A device service of its own, stopped afterwards.
	if [ -z "${FAKECUDA_SOCKET:-}" ]; then
		d=$(mktemp -d /tmp/carrier-bench.XXXXXX)
		export FAKECUDA_SOCKET=$d/devd.sock
		rc=0
		"$run" "$bench" "$@" || rc=$?
		"$run" --stop >/dev/null 2>&1
		rm -rf "$d"
		exit $rc
	fi
	exec "$run" "$bench" "$@"
fi
exec "$bench" "$@"
