#!/usr/bin/env bash
# run.sh - the real-GPU validation and benchmark suite, in one command.
#
#   bundle/scripts/run.sh [--sizes GiB,GiB,...] [--reps N] [--out DIR] [--budget SECONDS]
#                         [--only facts,val,ipc,gpu2,base,pool,bench,micro,scale,killed,fw,
#                                 bench-llm,bench-incr,bench-share,bench-carrier,jax,ddp] [--micro-iters N]
#                         [--micro-rounds N] [--micro-cpus LIST] [--native-baseline]
#
# Runs from a bundle made by test/gpu/bundle.sh (bin/criu, lib/, plugins/,
# baseline/cuda_plugin.so, workloads/, scripts/). On a machine with an
# NVIDIA GPU it uses NVIDIA's driver; with FAKE=1 (or no NVIDIA driver) the
# fake one, found through FAKECUDA_RUN or the build tree recorded in
# bundle/BUILDINFO (FAKECUDA_DEVICES=2 simulates two GPUs).
#
#  facts   test/gpu/facts.sh: NVIDIA's native checkpoint of sharing processes
#  val     gpu_job, 2 processes, two cycles and 4 processes, one cycle: bytes,
#          addresses, a kernel through an importer's original pointer, a
#          graph captured before the checkpoint replayed after it, sharing,
#          a fresh export/import after restore
#  gpu2    (2+ GPUs) the same with ranks on different GPUs, peer access
#  ipc     legacy cuIpc* memory beside VMM sharing, two cycles (XFAIL when
#          the interposer has no cuIpc* entry points)
#  base    CRIU's upstream cuda_plugin: a private-only job (works) and the
#          sharing job (how it fails)
#  pool    stream-ordered memory pools (gpu_pool): a private-pool job (2
#          processes: cudaMallocAsync-style default pool + a private POSIX pool,
#          two streams) through two cycles with our plugin; a 3-process job
#          sharing a pool by FD refused at preflight (pid, pool, reason), still
#          running with its bytes, then dumped and restored once released; the
#          same two jobs through upstream cuda_plugin as the baseline
#  bench   dump+restore of a 2-process job sharing S GiB vs the same bytes
#          held privately through cuda_plugin; the creator's extra RSS
#  micro   interposition cost: --micro-rounds (7) rounds, each one plain and
#          one LD_PRELOAD process back to back (plain first in odd rounds,
#          preloaded first in even ones), both pinned to the same CPUs
#          (--micro-cpus, default: CPUs 2,3 when there are 4 or more; "none"
#          leaves them unpinned); per loop: the median of the rounds' medians
#          and the min of each mode, the rounds' spread, and the ratio as the
#          median of the paired rounds' ratios (target <= 1.05)
#  fw      the real-framework jobs (fw.sh): PyTorch IPC and expandable
#          segments, cudaMallocAsync, a transformers LLM, CuPy IPC and small
#          arrays, against CRIU's upstream cuda_plugin
#  forked  forked.sh (not in the default set): the training jobs with
#          DataLoader workers, a forked helper, an NVML-only helper,
#          torch.compile, a pre-copy before each dump and the release hooks,
#          losses bit for bit, against upstream cuda_plugin; its rows here
#  jax     jobs.sh (not in the default set): a JAX training job (MLP, AdamW)
#          dumped after step 10 of 30 and restored, its losses bit for bit
#          against an uninterrupted run, with JAX's default preallocation,
#          XLA_PYTHON_CLIENT_PREALLOCATE=false and
#          XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async; each also through upstream
#          cuda_plugin (skipped where the disk cannot hold the GPU's memory);
#          carried bytes, dump/restore s, the pause line and SAVE summary.
#          Its rows here, its per-run report in --out's jobs.txt
#  ddp     jobs.sh: a DDP job (NCCL, one rank) as torchrun --standalone
#          starts it, the whole tree (agent + worker, established TCP)
#          through `cuinterpose checkpoint`/`restore` (or plain criu with
#          --tcp-established --network-lock nftables), and upstream's
#  bench-llm, bench-incr, bench-share, bench-carrier
#          issue 17's benchmarks (bench.sh; not in the default set, each one
#          call of at most 600 s): the LLM job at BENCH_LLM_GIB (2 8 32) and
#          a 4-process sharing job (BENCH_SHARE_GIB, 4) against upstream
#          cuda_plugin, peak extra RSS of every process, the carrier's
#          SAVE/LOAD rates against the best plain parallel write/read into
#          the same directory; carrier-bench -x striped over 16 files
#  killed  criu SIGKILLed (CUINTERPOSE_TEST_FAULT) after the native checkpoint of a
#          dump: the guardian restores and rebuilds the job in place; then
#          criu killed during a restore's LOAD: the guardian kills the tree
#          and the same images restore; bytes, addresses, a kernel checked
#  scale   scale-bench: SCALE_PROCS (4) processes x SCALE_ALLOCS (256) allocations,
#          every SCALE_EVERY-th (4) shared: the coordinator's phases, native
#          lock/checkpoint/restore/unlock of each process alone and of all at
#          once (target: group <= 1.2 x the slowest alone); carrier-bench -P
#          for OVERLAP_PROCS ("2 4") processes at once, OVERLAP_GIB (4) in all
#
# Prints a summary table at the end; with --out DIR writes summary.txt,
# results.tsv, run.log and logs.tar.gz there. Every wait is bounded (criu
# CRIU_TIMEOUT=120 s, job commands 20-600 s); no scenario starts after
# --budget seconds (default 420), and benchmark sizes whose estimate does not
# fit are skipped. Everything started runs below a subreaper that kills
# what is left. Debugging: KEEP=1 keeps the work directory, BENCH_PAUSE=S
# sleeps S seconds between a restore and the next dump.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

S=$(cd "$(dirname "$0")" && pwd)
# stat_state, live: beside this script in a bundle, in test/e2e in the tree
. "$S/procstate.sh" 2>/dev/null || . "$S/../e2e/procstate.sh" || exit 2
BUNDLE=${BUNDLE:-$(cd "$S/.." && pwd)}
WL=$BUNDLE/workloads

SIZES=1,4
REPS=3
OUTDIR=
BUDGET=420
ONLY=facts,val,gpu2,ipc,base,pool,bench,micro,scale,killed
MICRO_ITERS=200000
MICRO_ROUNDS=7
MICRO_CPUS=auto
NATIVE_BASE=0
while [ $# -gt 0 ]; do
	case "$1" in
	--sizes) SIZES=$2; shift ;;
	--reps) REPS=$2; shift ;;
	--out) OUTDIR=$2; shift ;;
	--budget) BUDGET=$2; shift ;;
	--only) ONLY=$2; shift ;;
	--micro-iters) MICRO_ITERS=$2; shift ;;
	--micro-rounds) MICRO_ROUNDS=$2; shift ;;
	--micro-cpus) MICRO_CPUS=$2; shift ;;
	--native-baseline) NATIVE_BASE=1 ;;
	*) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

# Below a subreaper: PID 1 may not reap, and restored trees land here.
if [ -z "${CUIP_GPU_REAPED:-}" ]; then
	export CUIP_GPU_REAPED=1
	exec "$WL/e2e_reaper" bash "$0" --sizes "$SIZES" --reps "$REPS" ${OUTDIR:+--out "$OUTDIR"} \
		--budget "$BUDGET" --only "$ONLY" --micro-iters "$MICRO_ITERS" \
		--micro-rounds "$MICRO_ROUNDS" --micro-cpus "$MICRO_CPUS" $([ "$NATIVE_BASE" = 1 ] && echo --native-baseline)
fi

if [ -n "$OUTDIR" ]; then
	mkdir -p "$OUTDIR"
	exec > >(tee "$OUTDIR/run.log") 2>&1
fi
T=$(mktemp -d /tmp/cuip-gpu.XXXXXX)
mkdir -p "$T/logs" "$T/plugins" "$T/base-plugins" "$T/sock" "$T/shimbin"
RESULTS=$T/results.tsv
: >"$RESULTS"
START=$(date +%s.%N)
elapsed() { echo "$(date +%s.%N) $START" | awk '{printf "%.0f", $1 - $2}'; }
say() { echo "[$(elapsed)s] $*"; }
want() { case ",$ONLY," in *,"$1",*) return 0 ;; esac; return 1; }
# result NAME STATUS DETAIL: one row of the summary
# (after a scenario skipped for the budget, the row says SKIP)
result() {
	local st=$2
	[ "${SC_RC:-0}" = 99 ] && st=SKIP
	printf '%s\t%s\t%s\n' "$1" "$st" "$3" >>"$RESULTS"
	say "RESULT $1: $st $3"
}

# ---- driver: NVIDIA's or the fake one -------------------------------------
MODE=${FAKE:-auto}
if [ "$MODE" = auto ]; then
	if ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1; then MODE=0; else MODE=1; fi
fi
R=() # prefix that runs a command on the chosen driver
if [ "$MODE" = 1 ]; then
	if [ -z "${FAKECUDA_RUN:-}" ] && [ -f "$BUNDLE/BUILDINFO" ]; then
		FAKECUDA_RUN=$(sed -n 's/^build=//p' "$BUNDLE/BUILDINFO")/test/fakecuda/fakecuda-run
	fi
	[ -x "${FAKECUDA_RUN:-}" ] || { echo "run.sh: FAKE=1 needs FAKECUDA_RUN=.../fakecuda-run" >&2; exit 2; }
	R=("$FAKECUDA_RUN")
	export FAKECUDA_SOCKET=$T/devd.sock
	export FAKECUDA_MEM_MB=${FAKECUDA_MEM_MB:-20480}
	export CRIU_FAULT=138 # FI_PLUGIN_CUDA_FORCE_ENABLE: cuda_plugin looks for /proc/driver/nvidia
	NDEV=${FAKECUDA_DEVICES:-1}
	DRIVER="fake driver (test/fakecuda), $NDEV device(s)"
else
	NDEV=$(ls -d /proc/driver/nvidia/gpus/* 2>/dev/null | wc -l)
	DRIVER="NVIDIA $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1), $NDEV GPU(s)"
fi
export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUINTERPOSE_SOCKET_DIR=$T/sock
CRIU=$BUNDLE/bin/criu
BOUNDED=$BUNDLE/bin/bounded # contrib/bounded
INTERPOSER=$BUNDLE/lib/libcuinterpose.so
ln -s "$BUNDLE/plugins/cuinterpose_plugin.so" "$T/plugins/"
BASE_PLUGIN=$BUNDLE/baseline/cuda_plugin.so
[ -f "$BASE_PLUGIN" ] && ln -s "$BASE_PLUGIN" "$T/base-plugins/"
if command -v cuda-checkpoint >/dev/null 2>&1; then
	CKPT_TOOL="NVIDIA cuda-checkpoint ($(command -v cuda-checkpoint))"
else
	ln -s "$WL/cuda-checkpoint-shim" "$T/shimbin/cuda-checkpoint"
	CKPT_TOOL="no NVIDIA cuda-checkpoint here: test/gpu/ckpt-shim.c (same cuCheckpointProcess* calls) stands in"
fi

JOBDIR=
cleanup() {
	kill_job
	[ "$MODE" = 1 ] && "${R[0]}" --stop >/dev/null 2>&1
	[ "${KEEP:-0}" = 1 ] && echo "kept $T" || rm -rf "$T"
}
trap cleanup EXIT
trap 'finish; exit 130' INT TERM

# ---- the job ---------------------------------------------------------------
job_pids() { cat "$JOBDIR"/r*.ready 2>/dev/null | awk '{print $2}'; }
kill_job() {
	[ -n "$JOBDIR" ] || return 0
	kill -9 $(job_pids) ${JOBSH:-} 2>/dev/null
	JOBDIR=
}
SEQ=0
# start_job NAME NPROCS PRELOAD(0|1) ARGS...: gpu_job (or $JOBBIN) in $T/NAME/w, waits until ready
start_job() {
	local name=$1 n=$2 pre=$3 i
	shift 3
	NP=$n
	JOBDIR=$T/$name/w
	mkdir -p "$JOBDIR"
	SEQ=0
	if [ "$pre" = 1 ]; then
		setsid env LD_PRELOAD="$INTERPOSER" "${R[@]}" "$WL/${JOBBIN:-gpu_job}" "$JOBDIR" "$n" "$@" \
			</dev/null >"$T/$name/job.log" 2>&1 &
	else
		setsid "${R[@]}" "$WL/${JOBBIN:-gpu_job}" "$JOBDIR" "$n" "$@" </dev/null >"$T/$name/job.log" 2>&1 &
	fi
	JOBSH=$!
	for ((i = 0; i < ${READY_TIMEOUT:-120} * 20; i++)); do
		[ "$(ls "$JOBDIR"/r*.ready 2>/dev/null | wc -l)" -ge "$n" ] && break
		if ls "$JOBDIR"/*.failed >/dev/null 2>&1; then
			echo "job failed to start: $(cat "$JOBDIR"/*.failed)"
			return 1
		fi
		sleep 0.05
	done
	[ "$(ls "$JOBDIR"/r*.ready 2>/dev/null | wc -l)" -ge "$n" ] || { echo "job not ready"; return 1; }
	JOBPID=$(awk '{print $2}' "$JOBDIR/r0.ready")
	echo "job $name ready: $(cat "$JOBDIR"/r*.ready | tr '\n' ';')"
}

# cmd TIMEOUT VERB [ARGS]: every rank runs it; 0 if all answered ok.
# CMDERR holds the first failure or a description of who did not answer.
cmd() {
	local to=$1 i r ans
	shift
	SEQ=$((SEQ + 1))
	echo "$SEQ $*" >"$JOBDIR/cmd.tmp" && mv "$JOBDIR/cmd.tmp" "$JOBDIR/cmd"
	for ((i = 0; i < to * 20; i++)); do
		[ "$(ls "$JOBDIR"/r*."$SEQ" 2>/dev/null | wc -l)" -ge "$NP" ] && break
		sleep 0.05
	done
	CMDERR=
	for ((r = 0; r < NP; r++)); do
		if [ ! -f "$JOBDIR/r$r.$SEQ" ]; then
			CMDERR="${CMDERR}rank $r: no answer to '$*' in ${to}s; "
			continue
		fi
		read -r ans <"$JOBDIR/r$r.$SEQ"
		case "$ans" in
		ok*) ;;
		*) CMDERR="${CMDERR}rank $r: $ans; " ;;
		esac
	done
	echo "cmd '$*': ${CMDERR:-ok}"
	[ -z "$CMDERR" ]
}
answers() { for ((r = 0; r < NP; r++)); do cat "$JOBDIR/r$r.$SEQ"; done; }

wait_gone() { # PIDS...: 0 once none is alive (zombies count as gone)
	local p i
	for p in "$@"; do
		for ((i = 0; i < 200; i++)); do
			live "$p" || break
			sleep 0.05
		done
		live "$p" && return 1
	done
	return 0
}

# wait_reaped PIDS...: 0 once none exists, zombies included (a zombie still
# holds its pid, and criu restore then fails "Can't fork for PID: File exists")
wait_reaped() {
	local p i
	for p in "$@"; do
		for ((i = 0; i < 400 && ${#p} > 0; i++)); do
			[ -d /proc/$p ] || break
			sleep 0.05
		done
		[ -d /proc/$p ] && return 1
	done
	return 0
}

# criu_do dump|restore DIR PLUGINDIR [extra]: criu under contrib/bounded
# (CRIU_TIMEOUT s; a hang is named with its log); sets SECS
criu_do() {
	local what=$1 d=$2 pl=$3 t0 rc
	shift 3
	mkdir -p "$d"
	t0=$(date +%s.%N)
	if [ "$what" = dump ]; then
		PATH=$T/shimbin:$PATH "$BOUNDED" "${CRIU_TIMEOUT:-120}" "${R[@]}" "$CRIU" dump -t "$JOBPID" -D "$d" \
			-L "$pl" --shell-job -v4 -o dump.log "$@"
	else
		PATH=$T/shimbin:$PATH "$BOUNDED" "${CRIU_TIMEOUT:-120}" "${R[@]}" "$CRIU" restore -D "$d" -L "$pl" \
			--shell-job --restore-detached -v4 -o restore.log "$@"
	fi
	rc=$?
	SECS=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.3f", $1 - $2}')
	echo "criu $what: rc=$rc in ${SECS}s"
	return $rc
}

# Keep the logs, drop the image data (it can be GiBs).
drop_images() { find "$1" -type f ! -name '*.log' -delete 2>/dev/null; }

# ---- scenarios (each runs in a subshell; exit 1 = failure, reason in $T/why)
# val NAME NPROCS CYCLES ARGS...: the full validation on our plugin
sc_val() {
	local name=$1 n=$2 cycles=$3 c before pids last
	shift 3
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	start_job "$name" "$n" 1 "$@" || fail "start: $(tail -n 1 "$T/$name/job.log")"
	grep -q "graph real" "$JOBDIR/r0.ready" && echo "graph: real CUDA graph" || echo "graph: emulated (driver has no graphs)"
	cmd 60 verify || fail "verify before: $CMDERR"
	before=$(answers)
	cmd 60 add 0 3 && cmd 60 graph && cmd 60 verify || fail "before the checkpoint: $CMDERR"
	last=$((n - 1))
	for ((c = 1; c <= cycles; c++)); do
		pids=$(job_pids)
		criu_do dump "$T/$name/d$c" "$T/plugins" || fail "criu dump (cycle $c) failed: $(grep -E 'Error|cuinterpose:.*(refus|fail)' "$T/$name/d$c/dump.log" | tail -n 2 | tr '\n' ' ')"
		grep -q "cuinterpose: SAVE:" "$T/$name/d$c/dump.log" || fail "no SAVE line in dump.log (cycle $c)"
		wait_gone $pids || fail "dumped processes still alive (cycle $c)"
		criu_do restore "$T/$name/d$c" "$T/plugins" || fail "criu restore (cycle $c) failed: $(grep -E 'Error|cuinterpose:.*(refus|fail)' "$T/$name/d$c/restore.log" | tail -n 2 | tr '\n' ' ')"
		drop_images "$T/$name/d$c"
		cmd 120 verify || fail "bytes after restore (cycle $c): $CMDERR"
		[ "$(answers)" = "$before" ] || fail "addresses changed (cycle $c): $(answers | tr '\n' ' ') vs $(echo $before)"
		cmd 60 add "$last" $((10 + c)) || fail "kernel through rank $last's original pointer after restore (cycle $c): $CMDERR"
		cmd 120 verify || fail "kernel write by rank $last not seen by every rank (cycle $c): $CMDERR"
		cmd 60 graph || fail "graph replay after restore (cycle $c): $CMDERR"
		cmd 120 verify || fail "bytes after graph replay (cycle $c): $CMDERR"
		cmd 60 fresh || fail "fresh export/import after restore (cycle $c): $CMDERR"
		cmd 60 addfresh || fail "kernel on the fresh import (cycle $c): $CMDERR"
		cmd 120 verify || fail "verify after fresh (cycle $c): $CMDERR"
	done
	cmd 30 exit
	echo "ok: $n processes, $cycles cycle(s), graph $(grep -o 'graph [a-z]*' "$JOBDIR/r0.ready" | cut -d' ' -f2)" >"$T/why"
	kill_job
}

# base NAME SHARE(0|1): the job without interposer through CRIU's cuda_plugin
sc_base() {
	local name=$1 share=$2 c pids rcd rcr
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	if [ "$share" = 0 ]; then
		start_job "$name" 2 0 --private-only --shared-mib 64 || fail "start: $(tail -n 1 "$T/$name/job.log")"
		cmd 60 graph && cmd 60 verify || fail "before: $CMDERR"
		for c in 1 2; do
			pids=$(job_pids)
			criu_do dump "$T/$name/d$c" "$T/base-plugins" || fail "criu dump (cycle $c)"
			grep -q "cuda_plugin: initialized" "$T/$name/d$c/dump.log" || fail "cuda_plugin did not initialize: $(grep -i cuda "$T/$name/d$c/dump.log" | head -n 2 | tr '\n' ' ')"
			wait_gone $pids || fail "dumped processes still alive"
			criu_do restore "$T/$name/d$c" "$T/base-plugins" || fail "criu restore (cycle $c)"
			drop_images "$T/$name/d$c"
			cmd 60 verify && cmd 60 graph && cmd 60 verify || fail "after restore (cycle $c): $CMDERR"
		done
		cmd 30 exit
		echo "ok: private-only job, 2 processes, 2 cycles, bytes and addresses verified" >"$T/why"
		kill_job
		return 0
	fi
	start_job "$name" 2 0 --shared-mib 64 || fail "start: $(tail -n 1 "$T/$name/job.log")"
	cmd 60 verify || fail "before: $CMDERR"
	pids=$(job_pids)
	criu_do dump "$T/$name/d" "$T/base-plugins"
	rcd=$?
	wait_gone $pids
	rcr=skipped
	[ $rcd = 0 ] && { criu_do restore "$T/$name/d" "$T/base-plugins"; rcr=$?; }
	local errs
	errs=$(grep -hE "cuda_plugin|cuda-checkpoint" "$T/$name"/d/*.log 2>/dev/null | grep -iE "fail|error|not supported|INVALID" | head -n 2 | sed 's/^.*: //' | tr '\n' ' ')
	if [ $rcd = 0 ] && [ "$rcr" = 0 ] && cmd 20 verify; then
		echo "UNEXPECTED: the sharing job survived cuda_plugin (dump rc 0, restore rc 0, bytes ok)" >"$T/why"
		exit 3
	fi
	echo "criu dump rc=$rcd, criu restore rc=$rcr; after restore: ${CMDERR:-n/a}; plugin log: ${errs:-none}" >"$T/why"
	kill_job
	exit 2
}

# pool NAME PLUGINDIR PRELOAD(0|1) SHARED(0|1): the gpu_pool jobs (test/e2e/e2e_pool.c).
# Private: 2 processes, two cycles, bytes and addresses, the pools still
# work after restore. Shared (3 processes, rank 0 exports pool and pointer):
# with our plugin the dump must be refused naming every pid and pool, the job
# keeps its bytes, and after the pool is released a cycle succeeds; through
# cuda_plugin exit 2 says how it failed (exit 3: it survived).
# POOL_CACHE_MIB=N (private jobs): each rank's two pools also cache N MiB
# (freed, kept by their release threshold, as JAX's cuda_async allocator
# does); each cycle then records the images' size and the dump and restore
# times, and the pools must hold the same reserved and used bytes after
# the restore as before the dump.
sc_pool() {
	local name=$1 pl=$2 pre=$3 shr=$4 c n=2 before pids rcd rcr p errs cache=${POOL_CACHE_MIB:-0} pools_pre sizes=
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	JOBBIN=gpu_pool
	[ "$shr" = 1 ] && n=3
	[ "$shr" = 1 ] && cache=0
	start_job "$name" "$n" "$pre" --mib "${POOL_MIB:-64}" $([ "$shr" = 1 ] && echo --shared) \
		$([ "$cache" -gt 0 ] && echo --cache "$cache") ||
		fail "start: $(tail -n 1 "$T/$name/job.log")"
	cmd 60 verify 0 || fail "verify before: $CMDERR"
	before=$(answers | awk '{print $2, $3, $4, $5, $6, $7}')
	for ((r = 0; r < n; r++)); do cmd 60 write $r 5 || fail "write: $CMDERR"; done
	cmd 60 verify 5 || fail "verify: $CMDERR"
	if [ "$shr" = 1 ] && [ "$pre" = 1 ]; then
		criu_do dump "$T/$name/dr" "$pl" && fail "criu dump succeeded with a shared pool"
		for p in $(job_pids); do
			grep -q "pid $p memory pool [0-9]* (device -\{0,1\}[0-9]*) is \(exported\|imported\)" "$T/$name/dr/dump.log" ||
				fail "the refusal does not name pid $p and its pool: $(grep 'cuinterpose:.*refus' "$T/$name/dr/dump.log" | head -n 1)"
			[ -d /proc/$p ] || fail "pid $p died after the refusal"
		done
		grep -q "QUIESCE" "$T/$name/dr/dump.log" && fail "the job was quiesced before the refusal"
		cmd 60 verify 5 || fail "bytes after the refusal: $CMDERR"
		cmd 60 churn || fail "pools after the refusal: $CMDERR"
		cmd 60 release-importers && cmd 60 release-creator || fail "release: $CMDERR"
	elif [ "$shr" = 1 ]; then
		pids=$(job_pids)
		criu_do dump "$T/$name/d" "$pl"
		rcd=$?
		wait_gone $pids
		rcr=skipped
		[ $rcd = 0 ] && { criu_do restore "$T/$name/d" "$pl"; rcr=$?; }
		errs=$(grep -hE "Error|cuda_plugin" "$T/$name"/d/*.log 2>/dev/null | grep -iE "fail|error|can't|not supported|INVALID|OPERATING" | head -n 3 | sed 's/^.*: //' | tr '\n' ' ')
		if [ $rcd = 0 ] && [ "$rcr" = 0 ] && cmd 20 verify 5; then
			echo "UNEXPECTED: the shared-pool job survived cuda_plugin (dump rc 0, restore rc 0, bytes ok)" >"$T/why"
			exit 3
		fi
		alive=0
		for p in $pids; do [ -d /proc/$p ] && alive=$((alive + 1)); done
		# a failed dump leaves the job running: does its CUDA still answer?
		[ $rcd != 0 ] && [ $alive -gt 0 ] && cmd 20 verify 5
		echo "criu dump rc=$rcd, criu restore rc=$rcr, $alive of $n processes alive; after: ${CMDERR:-n/a}; logs: ${errs:-none}" >"$T/why"
		kill_job
		exit 2
	fi
	for c in 1 2; do
		if [ "$cache" -gt 0 ]; then
			cmd 60 pools || fail "pools before the dump (cycle $c): $CMDERR"
			pools_pre=$(answers)
		fi
		pids=$(job_pids)
		criu_do dump "$T/$name/d$c" "$pl" || fail "criu dump (cycle $c) failed: $(grep -E 'Error|cuinterpose:.*(refus|fail)' "$T/$name/d$c/dump.log" | tail -n 2 | tr '\n' ' ')"
		[ "$cache" -gt 0 ] && sizes="$sizes cycle $c: images $(du -sm "$T/$name/d$c" | cut -f1) MiB, dump ${SECS}s"
		wait_gone $pids || fail "dumped processes still alive (cycle $c)"
		criu_do restore "$T/$name/d$c" "$pl" || fail "criu restore (cycle $c) failed: $(grep -E 'Error|cuinterpose:.*fail' "$T/$name/d$c/restore.log" | tail -n 2 | tr '\n' ' ')"
		[ "$cache" -gt 0 ] && sizes="$sizes, restore ${SECS}s;"
		drop_images "$T/$name/d$c"
		cmd 120 verify 5 || fail "bytes after restore (cycle $c): $CMDERR"
		[ "$shr" = 1 ] || [ "$(answers | awk '{print $2, $3, $4, $5, $6, $7}')" = "$before" ] ||
			fail "addresses changed (cycle $c): $(answers | tr '\n' ' ') vs $before"
		if [ "$cache" -gt 0 ]; then
			cmd 60 pools || fail "pools after the restore (cycle $c): $CMDERR"
			[ "$(answers)" = "$pools_pre" ] ||
				fail "the pools hold $(answers | tr '\n' ' ') after the restore, $(echo "$pools_pre" | tr '\n' ' ') before (cycle $c)"
		fi
		cmd 60 churn || fail "the pools after restore (cycle $c): $CMDERR"
	done
	cmd 30 exit
	if [ "$shr" = 1 ]; then
		echo "ok: refused at preflight naming every pid and pool, bytes intact; released: 2 cycles" >"$T/why"
	else
		echo "ok: private pools, $n processes, 2 cycles, bytes and addresses verified${sizes:+; each pool caching $cache MiB:$sizes the reserved and used bytes of the pools kept}" >"$T/why"
	fi
	kill_job
}

# killed NAME: criu killed part-way through a dump, then through a restore
# (the guardian's rollback and tree kill on the real driver; README "When
# criu dies part-way"). Recovery times come from the guardian's log.
sc_killed() {
	local name=$1 before pids glog i
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	guardian_says() { # DIR TEXT: wait (bounded) for TEXT in DIR's guardian log
		for ((i = 0; i < 1200; i++)); do
			grep -qs "$2" "$1/cuinterpose-guardian.log" && return 0
			sleep 0.05
		done
		return 1
	}
	start_job "$name" 2 1 || fail "start: $(tail -n 1 "$T/$name/job.log")"
	cmd 60 add 0 3 && cmd 60 verify || fail "before: $CMDERR"
	before=$(answers)
	CUINTERPOSE_TEST_FAULT=kill@native-checkpoint criu_do dump "$T/$name/k" "$T/plugins" && fail "killed dump succeeded"
	guardian_says "$T/$name/k" "rollback complete\|ROLLBACK FAILED" || fail "no guardian verdict after the killed dump"
	grep -q "rollback complete" "$T/$name/k/cuinterpose-guardian.log" ||
		fail "dump rollback: $(tail -n 3 "$T/$name/k/cuinterpose-guardian.log" | tr '\n' ' ')"
	echo "dump: $(grep -o 'rollback complete in [0-9.]* s' "$T/$name/k/cuinterpose-guardian.log")" >"$T/$name/times"
	cmd 120 verify || fail "bytes after the killed dump: $CMDERR"
	[ "$(answers)" = "$before" ] || fail "addresses changed after the killed dump"
	cmd 60 add 1 4 && cmd 120 verify || fail "kernel after the killed dump: $CMDERR"
	before=$(answers)
	pids=$(job_pids)
	criu_do dump "$T/$name/d" "$T/plugins" || fail "criu dump after the killed one"
	wait_gone $pids || fail "dumped processes still alive"
	CUINTERPOSE_TEST_FAULT=kill@LOAD criu_do restore "$T/$name/d" "$T/plugins"
	guardian_says "$T/$name/d" "restored tree killed" || fail "the guardian did not kill the half-restored tree"
	wait_gone $pids || fail "a half-restored process is still alive"
	wait_reaped $pids || fail "a half-restored process is still not reaped: $(for p in $pids; do live "$p" && echo "$p $(stat_state "$p")"; done | tr '\n' ' ')"
	echo "restore: $(grep -o 'restored tree killed [0-9.]* s' "$T/$name/d/cuinterpose-guardian.log")" >>"$T/$name/times"
	criu_do restore "$T/$name/d" "$T/plugins" || fail "criu restore after the killed one"
	cmd 120 verify || fail "bytes after restore: $CMDERR"
	[ "$(answers)" = "$before" ] || fail "addresses changed after restore"
	cmd 60 add 0 5 && cmd 120 verify || fail "kernel after restore: $CMDERR"
	cmd 30 exit
	echo "ok: $(tr '\n' ';' <"$T/$name/times")" >"$T/why"
	kill_job
}

run_killed() {
	scenario killed killed killed
	[ $SC_RC = 0 ] && result killed PASS "$SC_WHY" || result killed FAIL "$SC_WHY"
}

# scenario NAME FUNC ARGS...: run one scenario; PASS/FAIL/XFAIL row
scenario() {
	local name=$1 rc
	shift
	if [ "$(elapsed)" -gt "$BUDGET" ]; then
		SC_RC=99 SC_WHY="not run: past the budget (${BUDGET}s) at $(elapsed)s"
		return
	fi
	say "=== $name"
	rm -f "$T/why"
	mkdir -p "$T/$name"
	(sc_"$@") >"$T/logs/$name.log" 2>&1
	rc=$?
	kill -9 $(cat "$T/$name"/w/r*.ready 2>/dev/null | awk '{print $2}') 2>/dev/null
	SC_RC=$rc
	SC_WHY=$(cat "$T/why" 2>/dev/null || tail -n 1 "$T/logs/$name.log")
}

# ---- facts -----------------------------------------------------------------
run_facts() {
	SC_RC=0
	say "=== facts (NVIDIA native checkpoint of sharing processes)"
	FAKECUDA_RUN=${R[0]:-} timeout -k 5 240 bash "$S/facts.sh" "$WL" >"$T/logs/facts.log" 2>&1
	local rc=$? verdicts
	verdicts=$(grep afterwards "$T/logs/facts.log" | awk '{ $3 = ""; print }' | tr -s ' ' | tr '\n' ';')
	[ $rc = 0 ] && result facts DONE "$verdicts" || result facts FAIL "rc=$rc: $(tail -n 2 "$T/logs/facts.log" | tr '\n' ' ')"
}

# ---- validation ------------------------------------------------------------
run_val() {
	scenario val-2proc-2cycles val val-2proc-2cycles 2 2
	[ $SC_RC = 0 ] && result val-2proc-2cycles PASS "$SC_WHY" || result val-2proc-2cycles FAIL "$SC_WHY"
	scenario val-4proc val val-4proc 4 1
	[ $SC_RC = 0 ] && result val-4proc PASS "$SC_WHY" || result val-4proc FAIL "$SC_WHY"
}

run_gpu2() {
	if [ "$NDEV" -lt 2 ]; then
		result gpu2 SKIP "1 GPU visible: the two-GPU (peer access) scenario needs 2"
		return
	fi
	scenario gpu2-2proc-2cycles val gpu2-2proc-2cycles 2 2 --devices 2
	[ $SC_RC = 0 ] && result gpu2-2proc-2cycles PASS "ranks on GPU 0 and 1, peer access; $SC_WHY" ||
		result gpu2-2proc-2cycles FAIL "$SC_WHY"
	scenario gpu2-4proc val gpu2-4proc 4 1 --devices 2
	[ $SC_RC = 0 ] && result gpu2-4proc PASS "$SC_WHY" || result gpu2-4proc FAIL "$SC_WHY"
}

run_ipc() {
	# An interposer without the cuIpc* entry points leaves IPC to native
	# checkpoint, which cannot restore an importer (docs/driver-facts.md,
	# 'Native checkpoint of sharing processes').
	if grep -q cuIpcOpenMemHandle "$INTERPOSER"; then
		scenario ipc-2proc-2cycles val ipc-2proc-2cycles 2 2 --ipc
		[ $SC_RC = 0 ] && result ipc-2proc-2cycles PASS "legacy IPC (cuIpcOpenMemHandle) + VMM sharing; $SC_WHY" ||
			result ipc-2proc-2cycles FAIL "$SC_WHY"
		return
	fi
	scenario ipc-2proc val ipc-2proc 2 1 --ipc
	if [ $SC_RC = 0 ]; then
		result ipc-2proc XPASS "legacy IPC survived: $SC_WHY"
	else
		result ipc-2proc XFAIL "expected to fail until IPC support lands (no cuIpc* in the interposer): $SC_WHY"
	fi
}

run_base() {
	if [ ! -f "$BASE_PLUGIN" ]; then
		result base SKIP "no baseline/cuda_plugin.so in the bundle"
		return
	fi
	say "baseline checkpoint tool: $CKPT_TOOL"
	scenario base-private base base-private 0
	[ $SC_RC = 0 ] && result base-private PASS "$SC_WHY" || result base-private FAIL "$SC_WHY"
	scenario base-share base base-share 1
	case $SC_RC in
	2) result base-share "EXPECTED-FAIL" "$SC_WHY" ;;
	3) result base-share "UNEXPECTED-PASS" "$SC_WHY" ;;
	*) result base-share FAIL "harness: $SC_WHY" ;;
	esac
}

run_pool() {
	scenario pool-private pool pool-private "$T/plugins" 1 0
	[ $SC_RC = 0 ] && result pool-private PASS "$SC_WHY" || result pool-private FAIL "$SC_WHY"
	scenario pool-shared pool pool-shared "$T/plugins" 1 1
	[ $SC_RC = 0 ] && result pool-shared PASS "$SC_WHY" || result pool-shared FAIL "$SC_WHY"
	if [ ! -f "$BASE_PLUGIN" ]; then
		result pool-base SKIP "no baseline/cuda_plugin.so in the bundle"
		return
	fi
	scenario pool-base-private pool pool-base-private "$T/base-plugins" 0 0
	[ $SC_RC = 0 ] && result pool-base-private PASS "$SC_WHY" || result pool-base-private FAIL "$SC_WHY"
	scenario pool-base-shared pool pool-base-shared "$T/base-plugins" 0 1
	case $SC_RC in
	2) result pool-base-shared "EXPECTED-FAIL" "$SC_WHY" ;;
	3) result pool-base-shared "UNEXPECTED-PASS" "$SC_WHY" ;;
	*) result pool-base-shared FAIL "harness: $SC_WHY" ;;
	esac
}

# ---- benchmarks ------------------------------------------------------------
median() { sort -g | awk '{a[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# rss_watch PID FILE: until FILE.stop exists, the peak of VmHWM (reset first)
# and VmRSS over RSS-before, in KiB, into FILE
rss_watch() {
	local p=$1 f=$2 k v _ before=0 peak=0
	while read -r k v _; do [ "$k" = VmRSS: ] && before=$v; done </proc/$p/status
	echo 5 >/proc/$p/clear_refs 2>/dev/null
	while [ ! -e "$f.stop" ] && [ -d /proc/$p ]; do
		while read -r k v _; do
			case "$k" in VmRSS: | VmHWM:) [ "$v" -gt "$peak" ] && peak=$v ;; esac
		done </proc/$p/status 2>/dev/null
		sleep 0.01
	done
	echo "$before $peak $((peak > before ? peak - before : 0))" >"$f"
}

# bench_job NAME KIND(ours|base|native) MIB: REPS dump+restore cycles of one job
sc_bench() {
	local name=$1 kind=$2 mib=$3 c pids pl pre args w
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	case $kind in
	ours) pl=$T/plugins pre=1 args=(--shared-mib "$mib" --private-mib 16 --no-graph) ;;
	base) pl=$T/base-plugins pre=0 args=(--private-only --shared-mib "$mib" --private-mib 16 --no-graph) ;;
	native) pl=$T/plugins pre=0 args=(--private-only --shared-mib "$mib" --private-mib 16 --no-graph) ;;
	esac
	READY_TIMEOUT=600 start_job "$name" 2 $pre "${args[@]}" || fail "start: $(tail -n 1 "$T/$name/job.log")"
	: >"$T/$name/times"
	for ((c = 1; c <= REPS; c++)); do
		pids=$(job_pids)
		rm -f "$T/$name/rss" "$T/$name/rss.stop"
		rss_watch "$JOBPID" "$T/$name/rss" &
		w=$!
		criu_do dump "$T/$name/d$c" "$pl" || fail "criu dump (rep $c)"
		local ds=$SECS img
		touch "$T/$name/rss.stop"
		wait $w
		img=$(du -sm "$T/$name/d$c" | cut -f1)
		wait_gone $pids || fail "dumped processes alive"
		criu_do restore "$T/$name/d$c" "$pl" || fail "criu restore (rep $c)"
		echo "$ds $SECS $(cat "$T/$name/rss") $img" >>"$T/$name/times"
		[ "${BENCH_PAUSE:-0}" != 0 ] && sleep "$BENCH_PAUSE"
		drop_images "$T/$name/d$c"
		[ "$kind" = ours ] && grep -h "cuinterpose: \(SAVE\|LOAD\)" "$T/$name/d$c"/*.log | sed 's/^.*cuinterpose: /  /'
	done
	cmd 600 verify || fail "bytes after the last restore: $CMDERR"
	cmd 30 exit
	echo ok >"$T/why"
	kill_job
}

run_bench() {
	local s mib kinds k est
	kinds="ours"
	[ -f "$BASE_PLUGIN" ] && kinds="$kinds base"
	[ "$NATIVE_BASE" = 1 ] && kinds="$kinds native"
	for s in ${SIZES//,/ }; do
		mib=$(awk -v s="$s" 'BEGIN {printf "%d", s * 1024}')
		# H200 estimate: ~1.2 s/GiB per cycle ours, ~2.5 s/GiB cuda_plugin, ~1 s/GiB fill+verify
		est=$(awk -v s="$s" -v r="$REPS" 'BEGIN {printf "%d", 20 + s * (r * 4 + 2)}')
		SC_RC=0
		if [ $(($(elapsed) + est)) -gt "$BUDGET" ]; then
			result "bench-${s}G" SKIP "not started: ~${est}s left to do, budget ${BUDGET}s, at $(elapsed)s"
			continue
		fi
		for k in $kinds; do
			scenario "bench-${s}G-$k" bench "bench-${s}G-$k" "$k" "$mib"
			if [ $SC_RC != 0 ]; then
				result "bench-${s}G-$k" FAIL "$SC_WHY"
				continue
			fi
			local f=$T/bench-${s}G-$k/times d r t x
			d=$(awk '{print $1}' "$f" | median)
			r=$(awk '{print $2}' "$f" | median)
			t=$(awk '{print $1 + $2}' "$f" | median)
			x=$(awk '{print $5 / 1024}' "$f" | median)
			eval "T_${k}=$t"
			result "bench-${s}G-$k" DONE "$(printf 'dump %ss restore %ss total %ss (median of %s); creator extra RSS during dump %s MiB; images %s MiB' \
				"$d" "$r" "$t" "$(wc -l <"$f")" "$x" "$(awk '{print $6}' "$f" | median)")"
			[ "$k" = ours ] && X_ours=$x
		done
		if [ -n "${T_ours:-}" ] && [ -n "${T_base:-}" ]; then
			result "bench-${s}G-ratio" "$(awk -v a="$T_ours" -v b="$T_base" 'BEGIN {print (a / b <= 0.5) ? "MET" : "MISSED"}')" \
				"$(awk -v a="$T_ours" -v b="$T_base" 'BEGIN {printf "shared via cuinterpose / private via cuda_plugin = %.2f (target <= 0.5)", a / b}')"
		fi
		if [ -n "${X_ours:-}" ]; then
			# 1 MiB slack: the sample includes pages the dump itself touches
			result "bench-${s}G-rss" "$(awk -v x="$X_ours" 'BEGIN {print (x <= 257) ? "MET" : "MISSED"}')" \
				"creator's extra RSS during dump ${X_ours} MiB (target <= 256 MiB, +1 MiB sampling slack)"
		fi
		unset T_ours T_base T_native X_ours
	done
}

run_micro() {
	SC_RC=0
	if [ "$(elapsed)" -gt "$BUDGET" ]; then
		result micro SKIP "not run: past the budget"
		return
	fi
	say "=== micro (interposition cost)"
	local i m order cpus=$MICRO_CPUS pin=()
	if [ "$cpus" = auto ]; then
		cpus=none
		[ "$(nproc)" -ge 4 ] && cpus=2,3
	fi
	if [ "$cpus" != none ]; then
		if command -v taskset >/dev/null && taskset -c "$cpus" true 2>/dev/null; then
			pin=(taskset -c "$cpus")
		else
			say "micro: cannot pin to CPUs $cpus (taskset): unpinned"
			cpus=none
		fi
	fi
	# micro.log: "MODE ROUND LOOP MEDIAN MIN MAX", one line per loop and process
	: >"$T/logs/micro.log"
	for ((i = 1; i <= MICRO_ROUNDS; i++)); do
		order="plain preload"
		[ $((i % 2)) = 0 ] && order="preload plain"
		for m in $order; do
			if [ $m = preload ]; then
				timeout 120 env LD_PRELOAD="$INTERPOSER" "${R[@]}" "${pin[@]}" "$WL/gpu_microbench" "$MICRO_ITERS" 5
			else
				timeout 120 "${R[@]}" "${pin[@]}" "$WL/gpu_microbench" "$MICRO_ITERS" 5
			fi | sed "s/^/$m $i /" >>"$T/logs/micro.log" 2>&1
		done
	done
	# The last three are diagnostics (gpu_microbench.c): the driver's own
	# cost of VMM memory, and the gate against the driver's cheapest path.
	for op in props copy+launch launch copy+launch-vmm launch-vmm launch-null; do
		local line
		line=$(awk -v o="$op" -v n="$MICRO_ROUNDS" '
			function med(v, k,   i, j, t) {
				for (i = 2; i <= k; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
				return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
			}
			$3 == o && NF == 6 { if ($1 == "plain") { pa[$2] = $4; pm[$2] = $5 } else if ($1 == "preload") { qa[$2] = $4; qm[$2] = $5 } }
			END {
				k = 0; pmin = qmin = 1e300; plo = qlo = rlo = 1e300; phi = qhi = rhi = 0
				for (r = 1; r <= n; r++) {
					if (!(r in pa) || !(r in qa) || pa[r] <= 0) continue
					k++; a[k] = pa[r]; b[k] = qa[r]; q[k] = qa[r] / pa[r]
					if (pm[r] < pmin) pmin = pm[r]; if (qm[r] < qmin) qmin = qm[r]
					if (pa[r] < plo) plo = pa[r]; if (pa[r] > phi) phi = pa[r]
					if (qa[r] < qlo) qlo = qa[r]; if (qa[r] > qhi) qhi = qa[r]
					if (q[k] < rlo) rlo = q[k]; if (q[k] > rhi) rhi = q[k]
				}
				if (k == 0) { print "nan"; exit }
				pmed = med(a, k); qmed = med(b, k); rmed = med(q, k)
				printf "%s %.1f ns plain (min %.1f, rounds %.1f-%.1f: spread %.0f%%), %.1f ns preloaded (min %.1f, rounds %.1f-%.1f: spread %.0f%%); paired ratio %.3f (rounds %.3f-%.3f, %d pairs, CPUs %s; target <= 1.05)\n",
					rmed <= 1.05 ? "MET" : "MISSED", pmed, pmin, plo, phi, 100 * (phi - plo) / pmed,
					qmed, qmin, qlo, qhi, 100 * (qhi - qlo) / qmed, rmed, rlo, rhi, k, cpus
			}' cpus="$cpus" "$T/logs/micro.log")
		if [ "$line" = nan ] || [ -z "$line" ]; then
			result "micro-$op" FAIL "no numbers (see micro.log)"
			continue
		fi
		case $op in
		*-vmm | launch-null) result "micro-$op" DONE "${line#* }" ;;
		*) result "micro-$op" "${line%% *}" "${line#* }" ;;
		esac
	done
	# Device memory of 1,000 small cuMemAlloc (issue 22: slabs, not a
	# granule each): native and preloaded, target <= 1.1x.
	timeout 120 "${R[@]}" "$WL/gpu_microbench" --small-allocs-ratio "$INTERPOSER" 1000 >"$T/logs/small-allocs.log" 2>&1
	local rc=$?
	for kib in 4 64; do
		local line
		line=$(grep "x $kib KiB:" "$T/logs/small-allocs.log")
		if [ -z "$line" ]; then
			result "small-allocs-${kib}k" FAIL "no numbers (rc $rc, see small-allocs.log)"
		else
			result "small-allocs-${kib}k" "$(echo "$line" | grep -q "above 1.1x" && echo MISSED || echo MET)" \
				"${line#small-allocs } (target <= 1.1)"
		fi
	done
}

# scale NPROC NALLOC EVERY: scale-bench workers (NALLOC allocations of one
# granule each, every EVERY-th shared with all others) driven by the plugin's
# coordinator: dump phases, rounds of native lock/checkpoint/restore/unlock
# (each process alone, then all at once), rebuild, every tag checked.
sc_scale() {
	local np=$1 n=$2 every=$3 d=$T/scale r i pids
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; kill -9 $pids 2>/dev/null; exit 1; }
	mkdir -p "$d/w" "$d/img"
	for ((r = 0; r < np; r++)); do
		setsid env LD_PRELOAD="$INTERPOSER" "${R[@]}" "$WL/scale-bench" worker "$d/w" $r "$np" "$n" "$every" \
			</dev/null >"$d/worker$r.log" 2>&1 &
	done
	for ((i = 0; i < 6000; i++)); do
		[ "$(ls "$d"/w/r*.ready 2>/dev/null | wc -l)" -ge "$np" ] && break
		sleep 0.05
	done
	pids=$(cat "$d"/w/r*.ready 2>/dev/null | tr '\n' ' ')
	[ "$(ls "$d"/w/r*.ready 2>/dev/null | wc -l)" -ge "$np" ] || fail "workers not ready: $(tail -qn 1 "$d"/worker*.log)"
	timeout -k 5 600 "${R[@]}" "$WL/scale-bench" coord "$d/w" "$np" "$T/sock" "$d/img" native | tee "$d/coord.out" ||
		fail "coordinator: $(tail -n 2 "$d/coord.out" | tr '\n' ' ')"
	kill -USR1 $pids
	for ((r = 0; r < np; r++)); do
		for ((i = 0; i < 2400; i++)); do
			[ -f "$d/w/r$r.v1" ] && break
			sleep 0.05
		done
		grep -q '^ok' "$d/w/r$r.v1" 2>/dev/null || fail "rank $r after the cycle: $(cat "$d/w/r$r.v1" 2>/dev/null)"
	done
	kill -TERM $pids 2>/dev/null
	echo ok >"$T/why"
}

run_scale() {
	local np=${SCALE_PROCS:-4} n=${SCALE_ALLOCS:-256} every=${SCALE_EVERY:-4} f P
	scenario scale scale "$np" "$n" "$every"
	f=$T/scale/coord.out
	if [ $SC_RC != 0 ]; then
		result scale FAIL "$SC_WHY"
	else
		result scale-native "$(awk '/^native, all/ {print ($9 <= 1.2) ? "MET" : "MISSED"}' "$f")" \
			"$np processes x $n allocations: $(grep '^native, all' "$f" | sed 's/^native, //') (target <= 1.2)"
		result scale-phases DONE "$(awk '/^SUMMARY/ {for (i = 3; i <= NF; i++) printf "%s ", $i}' "$f")"
	fi
	# Carriers of several processes at once, each on its own GPU (wrapping).
	for P in ${OVERLAP_PROCS:-2 4}; do
		SC_RC=0
		if [ "$(elapsed)" -gt "$BUDGET" ]; then
			result "carrier-overlap-$P" SKIP "not run: past the budget"
			continue
		fi
		say "=== carrier overlap, $P processes"
		timeout -k 5 300 "${R[@]}" "$WL/carrier-bench" -P "$P" -s "${OVERLAP_GIB:-4}G" -r 3 -d "${OVERLAP_DIR:-/tmp}" \
			>"$T/logs/overlap-$P.log" 2>&1
		if grep -q '^overlap' "$T/logs/overlap-$P.log"; then
			result "carrier-overlap-$P" DONE "$(grep -A1 '^1 process' "$T/logs/overlap-$P.log" | tr -s ' ' | tr '\n' ';') $(grep '^overlap' "$T/logs/overlap-$P.log")"
		else
			result "carrier-overlap-$P" FAIL "$(tail -n 2 "$T/logs/overlap-$P.log" | tr '\n' ' ')"
		fi
	done
}

. "$S/fw.sh"
. "$S/bench.sh"

finish() {
	[ -n "${FINISHED:-}" ] && return
	FINISHED=1
	{
		cat "$T/header.txt"
		echo "baseline tool: $CKPT_TOOL"
		echo "total: $(elapsed)s"
		echo
		awk -F '\t' '{printf "%-22s %-15s %s\n", $1, $2, $3}' "$RESULTS"
	} >"$T/summary.txt"
	echo
	echo "================ summary ================"
	cat "$T/summary.txt"
	if [ -n "$OUTDIR" ]; then
		# criu -v4 logs are MBs each: whole ones only for failed rows
		local n f
		for n in $(awk -F '\t' '$2 != "FAIL" && $2 != "UNEXPECTED-PASS" {print $1}' "$RESULTS"); do
			for f in "$T/$n"/d*/*.log; do
				[ -f "$f" ] || continue
				grep -E "cuinterpose|cuda_plugin|cuda-checkpoint|Error|Warn|FAIL" "$f" >"$f.tmp"
				mv "$f.tmp" "$f"
			done
		done
		cp "$T/summary.txt" "$RESULTS" "$OUTDIR/"
		(cd "$T" && find . -name '*.log' -o -name times -o -name '*.txt' | tar czf "$OUTDIR/logs.tar.gz" -T - 2>/dev/null)
		echo "written: $(cd "$OUTDIR" && ls | tr '\n' ' ')"
	fi
}

# ---- main ------------------------------------------------------------------
{
	echo "cuinterpose GPU suite, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -r), $(nproc) cores"
	echo "driver: $DRIVER"
	echo "criu: $("${R[@]}" "$CRIU" --version 2>&1 | head -n 1)"
	echo "sizes: $SIZES GiB, reps $REPS, budget ${BUDGET}s, parts: $ONLY"
} | tee "$T/header.txt"
[ "$MODE" = 0 ] && nvidia-smi >"$T/logs/nvidia-smi.txt" 2>&1
want facts && run_facts
want val && run_val
want gpu2 && run_gpu2
want ipc && run_ipc
want base && run_base
want pool && run_pool
want micro && run_micro
want bench && run_bench
want scale && run_scale
want fw && run_fw
if want forked; then
	# its own subreaper and directory; its rows become this run's
	bash "$S/forked.sh" --out "$T/forked" 2>&1 | sed 's/^/  forked: /'
	[ -s "$T/forked/summary.txt" ] || result forked FAIL "forked.sh wrote no summary (see the forked: lines)"
	[ -s "$T/forked/summary.txt" ] && while IFS=$'\t' read -r n st why; do
		case $st in PASS | UPSTREAM-FAILS | MET | MISSED) ;; *) st=FAIL ;; esac
		result "forked-$n" "$st" "$why"
	done <"$T/forked/summary.txt"
fi
if want jax || want ddp; then
	# issue #46's jobs (jobs.sh, below this run's reaper, in a directory
	# of its own): their rows become this run's
	jo=$(for p in jax ddp; do want $p && printf '%s,' $p; done)
	bash "$S/jobs.sh" --only "${jo%,}" --budget $((BUDGET - $(elapsed))) --out "$T/jobs" 2>&1 | sed 's/^/  jobs: /'
	[ -s "$T/jobs/summary.txt" ] || result jobs FAIL "jobs.sh wrote no summary (see the jobs: lines)"
	[ -s "$T/jobs/summary.txt" ] && while IFS=$'\t' read -r n st why; do
		case $st in PASS | SKIP | UPSTREAM-PASS | UPSTREAM-FAILS) ;; *) st=FAIL ;; esac
		result "$n" "$st" "$why"
	done <"$T/jobs/summary.txt"
	[ -n "$OUTDIR" ] && cp "$T/jobs/jobs.txt" "$OUTDIR/" 2>/dev/null
fi
want killed && run_killed
want bench-llm && run_bench_llm
want bench-incr && run_bench_incr
want bench-share && run_bench_share
want bench-carrier && run_bench_carrier

finish
! grep -qP '\t(FAIL|UNEXPECTED-PASS)\t' "$RESULTS"
rc=$?
# let tee write run.log out before the subreaper kills what is left
exec 1>&- 2>&-
sleep 0.3
exit $rc
