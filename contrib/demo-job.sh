#!/usr/bin/env bash
# demo-job.sh BUILDDIR: the demo itself (contrib/demo.sh sets it up).
# A parent and 3 children share three VMM allocations through POSIX file
# descriptors, beside private GPU memory; `criu dump` checkpoints the group,
# `criu restore` brings it back, and the job checks every byte and address.
set -euo pipefail
build=$1
D=/tmp/cuinterpose-demo
rm -rf "$D"
mkdir -p "$D/img"
say() { printf '\n== %s\n' "$*"; }

if [ -e /proc/driver/nvidia/gpus ] && ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1; then
	RUN=()
	echo "NVIDIA driver found: running on the GPU"
else
	export FAKECUDA_SOCKET=$D/devd.sock
	RUN=(/usr/local/lib/cuinterpose/fakecuda/fakecuda-run)
	echo "no NVIDIA GPU: running on the fake CUDA driver (device memory lives in fakecuda-devd)"
fi
cleanup() {
	[ -n "${job:-}" ] && kill -9 $job $(cat "$D/ready" 2>/dev/null) 2>/dev/null || true
	[ ${#RUN[@]} -gt 0 ] && "${RUN[0]}" --stop >/dev/null 2>&1 || true
}
trap cleanup EXIT

round() { # round N: ask every process to verify, wait for the verdict
	kill -USR1 "$parent"
	for _ in $(seq 200); do
		grep -q "^round $1 " "$D/results" 2>/dev/null && break
		sleep 0.05
	done
	grep "^round $1 " "$D/results" || { echo "no verdict for round $1"; exit 1; }
	grep -q "^round $1 ok" "$D/results"
}

say "start the job: cuinterpose run -- vmm_share -n 3"
setsid "${RUN[@]}" cuinterpose run -- "$build/test/interposer/vmm_share" -n 3 -r "$D/ready" -o "$D/results" \
	</dev/null >"$D/job.log" 2>&1 &
job=$!
disown "$job"
for _ in $(seq 400); do [ -s "$D/ready" ] && break; sleep 0.05; done
[ -s "$D/ready" ] || { cat "$D/job.log"; exit 1; }
read -r parent children <"$D/ready"
echo "processes: parent $parent, children $children"
say "what the interposer tracks in the parent (cuinterpose inspect $parent)"
cuinterpose inspect "$parent" | head -n 20
say "before the checkpoint: every process verifies its memory"
round 1

say "criu dump -t $parent -D $D/img"
"${RUN[@]}" criu dump -t "$parent" -D "$D/img" -v4 -o dump.log
grep "cuinterpose:" "$D/img/dump.log" | grep -vE ": pid [0-9]+ done" | grep -E "participants|SAVE|NATIVE|bytes|done" |
	sed "s/^/  /" | head -n 16
ls -la "$D/img" | grep cuinterpose | sed 's/^/  /'
for p in $parent $children; do
	if kill -0 "$p" 2>/dev/null && [ "$(awk '{print $3}' /proc/$p/stat)" != Z ]; then
		echo "process $p still running after dump"
		exit 1
	fi
done
echo "the job is gone; its GPU memory was released"

say "the checkpoint's cuinterpose images (cuinterpose show $D/img)"
cuinterpose show "$D/img" | grep -E "^inventory|participants|^== |^  [0-9a-f]+:[0-9]+  cuinterpose-carrier|^OK|^FAIL"

say "criu restore -D $D/img"
"${RUN[@]}" criu restore -D "$D/img" --restore-detached -v4 -o restore.log
grep "cuinterpose:" "$D/img/restore.log" | grep -vE ": pid [0-9]+ done" |
	grep -E "participants|LOAD|REBUILD|VERIFY|NATIVE|done" | sed "s/^/  /" | head -n 16
say "after the restore: same pids, same addresses, every byte, sharing intact"
round 2
kill -TERM "$parent"
echo
echo "demo: checkpoint and restore of 4 processes sharing GPU memory verified"
