#!/usr/bin/env bash
# Reproduces the native-checkpoint table of docs/driver-facts.md ('Native
# checkpoint of sharing processes') with one binary on whatever
# driver is present: NVIDIA's on a GPU machine, or the fake one when run as
#   FAKECUDA_RUN=path/to/fakecuda-run test/gpu/facts.sh BINDIR
# BINDIR holds facts-workload and fakecuda-ckpt. Prints one line per
# (scenario, process, step) and a final "afterwards" verdict per process;
# diffing the output of the two drivers checks the fake's faithfulness.
set -u
bin=${1:?usage: facts.sh BINDIR}
run=${FAKECUDA_RUN:-}
work=$(mktemp -d /tmp/cuip-facts.XXXXXX)
pids=()

cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

# start NAME ARGS...: runs the workload with a FIFO on stdin, output in $work/NAME.out
start() {
	local name=$1
	shift
	mkfifo "$work/$name.in"
	$run "$bin/facts-workload" "$@" <"$work/$name.in" >"$work/$name.out" 2>&1 &
	eval "exec {fd_$name}>$work/$name.in"
	pids+=($!)
	eval "pid_$name=$!"
	# Not a job of this shell: no "Killed" report when cleanup kills it.
	disown $!
}

# wait_for NAME WORD [SECONDS]: wait until NAME's output has a line starting with WORD
wait_for() {
	local i
	for ((i = 0; i < ${3:-20} * 10; i++)); do
		grep -q "^$2" "$work/$1.out" 2>/dev/null && return 0
		grep -q "^error" "$work/$1.out" 2>/dev/null && return 1
		sleep 0.1
	done
	return 1
}

step() { # step SCENARIO NAME ACTION [FAKECUDA-CKPT ARGS...]
	local pid out sc=$1 name=$2 action=$3
	shift 3
	pid=$(eval echo "\$pid_$name")
	out=$($run "$bin/fakecuda-ckpt" --pid "$pid" --action "$action" --timeout 10000 "$@" 2>&1)
	case "$out" in
	*CUDA_ERROR*) out=$(echo "$out" | grep -o 'CUDA_ERROR_[A-Z_]*' | head -n 1) ;;
	*) out="ok" ;;
	esac
	state=$($run "$bin/fakecuda-ckpt" --pid "$pid" --action state "$@" 2>&1 | tail -n 1)
	printf '%-14s %-8s %-10s %-34s state=%s\n' "$sc" "$name" "$action" "$out" "$state"
}

afterwards() { # afterwards SCENARIO NAME
	local fd verdict
	fd=$(eval echo "\$fd_$2")
	: >"$work/$2.out"
	echo verify >&"$fd"
	if wait_for "$2" ok 5; then
		verdict="bytes correct"
	elif grep -q '^bad' "$work/$2.out"; then
		verdict="$(grep '^bad' "$work/$2.out" | head -n 1)"
	else
		verdict="no answer (stuck in its next CUDA call)"
	fi
	printf '%-14s %-8s %-10s %s\n' "$1" "$2" afterwards "$verdict"
}

cycle() { # cycle SCENARIO NAME: lock, checkpoint, restore, unlock
	for a in lock checkpoint restore unlock; do step "$1" "$2" "$a"; done
}

start priv private
wait_for priv ready 60 || { cat "$work/priv.out"; exit 1; }
cycle private priv
afterwards private priv

# The same from a caller that never called cuInit (--no-init): the
# checkpoint API needs no initialized CUDA in the caller.
start nipriv private
wait_for nipriv ready 60 || { cat "$work/nipriv.out"; exit 1; }
for a in tid lock checkpoint tid restore unlock; do step no-cuinit nipriv $a --no-init; done
afterwards no-cuinit nipriv

# Targets that are no CUDA process, or no process at all, from callers with
# and without cuInit.
sleep 600 &
pid_plain=$!
pids+=($pid_plain)
disown $!
sh -c 'exit 0' &
pid_gone=$!
wait $pid_gone
for init in "" --no-init; do
	for a in state tid lock checkpoint restore unlock; do step "no-cuda${init:+-ni}" plain $a $init; done
	for a in state tid lock checkpoint restore unlock; do step "no-process${init:+-ni}" gone $a $init; done
done

for keep in close keep; do
	start vexp$keep vmm-export "$work/vmm-$keep.sock" "$keep"
	wait_for vexp$keep listening 60 || { cat "$work/vexp$keep.out"; exit 1; }
	start vimp$keep vmm-import "$work/vmm-$keep.sock"
	wait_for vimp$keep ready 60 || { cat "$work/vimp$keep.out"; exit 1; }
	wait_for vexp$keep ready 60
	cycle "vmm-fd-$keep" vimp$keep
	cycle "vmm-fd-$keep" vexp$keep
	afterwards "vmm-fd-$keep" vexp$keep
	afterwards "vmm-fd-$keep" vimp$keep
done

start iexp ipc-export "$work/ipc.handle"
wait_for iexp ready 60 || { cat "$work/iexp.out"; exit 1; }
start iimp ipc-import "$work/ipc.handle"
wait_for iimp ready 60 || { cat "$work/iimp.out"; exit 1; }
cycle ipc iimp
cycle ipc iexp
afterwards ipc iexp
afterwards ipc iimp
