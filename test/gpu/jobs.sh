#!/usr/bin/env bash
# jobs.sh - issue #46's jobs on the GPU machine, with a bundle (test/gpu/bundle.sh):
#
#   bundle/scripts/jobs.sh [--out DIR] [--only jax,ddp,hostmem] [--budget SECONDS]
#   (or through run.sh: bundle/scripts/run.sh --only jax,ddp --out DIR)
#
# Every job is run straight through once (the reference, no interposer, no
# checkpoint), then again with a pause after step JOBS_AT (10) of
# JOBS_STEPS (30): dumped there, restored, let go on; its per-step losses
# (float.hex()) must equal the reference's bit for bit.
#
#  jax-VARIANT       frameworks/jaxjob.py (an MLP + 1 GiB of device ballast
#                    rewritten each step, AdamW: optax's, or written out with
#                    jax.grad when optax is missing) under `cuinterpose run`,
#                    dumped and restored with plain criu (bounded, as
#                    forked.sh does) and our plugin. VARIANTs (JAX_VARIANTS):
#                      prealloc    JAX's default: 75% of the GPU preallocated
#                                  (XLA_PYTHON_CLIENT_PREALLOCATE unset)
#                      noprealloc  XLA_PYTHON_CLIENT_PREALLOCATE=false
#                      async       XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async
#                                  (cudaMallocAsync; preallocation left as is)
#                    XLA_FLAGS gets deterministic ops and no autotuning, the
#                    spelling this JAX accepts (probed on the CPU backend).
#  jax-VARIANT-lazy  (VARIANTs in JAX_LAZY, default prealloc) the same
#                    dump, restored with criu's lazy pages: `criu
#                    lazy-pages` serves the job's host memory from the
#                    images through userfaultfd while the job runs (a
#                    measurement: the product restores every page before
#                    the job runs; docs/benchmarks.md says why); the row
#                    adds when every host page was in place
#  hostmem[-lazy]    after jax-prealloc (JOBS_HOSTMEM=0: not): a process
#                    without CUDA holding as much host memory as that
#                    job's restore brought back, every byte 0xFF as JAX's
#                    allocator table (frameworks/hostmem.py), dumped and
#                    restored by plain criu without a plugin, then lazily:
#                    criu's own time for that memory, bytes checked.
#                    `--only hostmem` runs it alone at JOBS_HOSTMEM_MIB
#                    (4096), without a GPU
#  jax-VARIANT-base  the same job without the interposer through CRIU's
#                    upstream cuda_plugin; run only when the free disk under
#                    the image directory is > 1.3x and the host's available
#                    memory > 1.1x the GPU memory in use at the pause
#                    ("skipped: disk" / "skipped: host memory"): its native
#                    checkpoint writes all of it (JOBS_BASE=0: none of them)
#  ddp               frameworks/ddpjob.py as `torchrun --standalone
#                    --nproc_per_node=1` starts it (python3 -m
#                    torch.distributed.run): an NCCL process group of one
#                    rank, DDP, AdamW; the whole tree (the agent, which holds
#                    the TCPStore, and the worker) dumped from the agent's
#                    pid; NCCL on loopback without InfiniBand or a net
#                    plugin (nothing criu cannot dump). Through
#                    `cuinterpose checkpoint`/`restore` when
#                    the bundle's CLI picks --tcp-established and the network
#                    lock itself (it records them in DIR/cuinterpose-criu-flags),
#                    else plain criu with --tcp-established --network-lock
#                    nftables (iptables when criu has no nftables and
#                    iptables-restore is there); the row says which
#  ddp-base          the same tree without the interposer, plain criu with
#                    those flags and upstream cuda_plugin
#
# Each row gives the GPU memory in use at the pause, the carried bytes (our
# SAVE line) and the images' size, dump and restore seconds, and from our
# dump.log the plugin's pause line ("pause: CUDA calls held X s, threads
# frozen Y s") and SAVE summary. Results: DIR/summary.txt (NAME, PASS / FAIL
# / SKIP for ours, UPSTREAM-PASS / UPSTREAM-FAILS / SKIP for upstream, the
# numbers), DIR/jobs.txt (the same per run, one block each, ours beside
# upstream), DIR/NAME.job.log (the job's output), DIR/NAME/ (its losses,
# info, filtered criu logs). Images go to a directory of their own under
# JOBS_IMGDIR (default /tmp), never to DIR, and are deleted after each run;
# a dump that leaves less than JOBS_MIN_FREE_MIB (4096) free there is
# killed. Every wait is bounded: the job JOBS_TIMEOUT (300 s) to each pause
# or end, criu CRIU_TIMEOUT (300 s); no run starts past --budget seconds
# (default 480).
# JOBS_PY (python3) runs the jobs; JAX_BALLAST_MIB (1024) sizes the ballast.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(cd "$(dirname "$0")" && pwd)
# stat_state, live: beside this script in a bundle, in test/e2e in the tree
. "$S/procstate.sh" 2>/dev/null || . "$S/../e2e/procstate.sh" || exit 2
BUNDLE=${BUNDLE:-$(cd "$S/.." && pwd)}
OUT=
ONLY=jax,ddp
BUDGET=480
while [ $# -gt 0 ]; do
	case $1 in
	--out) OUT=$2; shift ;;
	--only) ONLY=$2; shift ;;
	--budget) BUDGET=$2; shift ;;
	*) echo "jobs.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
# Below a subreaper (PID 1 there may not reap): the dumped trees' processes
# must be reaped before criu restores them under the same pids.
if [ -z "${CUIP_GPU_REAPED:-}" ]; then
	export CUIP_GPU_REAPED=1
	exec "$BUNDLE/workloads/e2e_reaper" bash "$0" --only "$ONLY" --budget "$BUDGET" ${OUT:+--out "$OUT"}
fi

STEPS=${JOBS_STEPS:-30}
AT=${JOBS_AT:-10}
TMO=${JOBS_TIMEOUT:-300}
CRIU_TIMEOUT=${CRIU_TIMEOUT:-300}
PY=${JOBS_PY:-python3}
JAX_VARIANTS=${JAX_VARIANTS:-prealloc noprealloc async}
JAX_LAZY=${JAX_LAZY-prealloc}
T=$(mktemp -d /tmp/cuip-jobs.XXXXXX)
OUT=${OUT:-$T/out}
IMG=$T/img # or a directory of its own under JOBS_IMGDIR, removed at the end
[ -n "${JOBS_IMGDIR:-}" ] && IMG=$(mktemp -d "$JOBS_IMGDIR/cuip-jobs-img.XXXXXX")
mkdir -p "$OUT" "$IMG" "$T/plugins" "$T/base-plugins" "$T/sock" "$T/shimbin" "$T/pylib"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/summary.txt"
: >"$OUT/jobs.txt"
export CUINTERPOSE_SOCKET_DIR=$T/sock
export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} # criu's and the CLI's libraries
CRIU=$BUNDLE/bin/criu
BOUNDED=$BUNDLE/bin/bounded
CLI=$BUNDLE/bin/cuinterpose
INTERPOSER=$BUNDLE/lib/libcuinterpose.so
ln -s "$BUNDLE/plugins/cuinterpose_plugin.so" "$T/plugins/"
[ -f "$BUNDLE/baseline/cuda_plugin.so" ] && ln -s "$BUNDLE/baseline/cuda_plugin.so" "$T/base-plugins/"
command -v cuda-checkpoint >/dev/null || ln -s "$BUNDLE/workloads/cuda-checkpoint-shim" "$T/shimbin/cuda-checkpoint"
# The jobs get only the bundle's libraries the interposer and the CLI need.
ldd "$INTERPOSER" "$CLI" 2>/dev/null | awk -v b="$BUNDLE/lib/" 'index($3, b) == 1 {print $3}' |
	sort -u | xargs -r ln -sf -t "$T/pylib"

START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }
want() { case ",$ONLY," in *,"$1",*) return 0 ;; esac; return 1; }
say() { echo "[$(date +%T) $(elapsed)s] $*"; }
result() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$OUT/summary.txt"; say "RESULT $1: $2 $3"; }
past_budget() { [ "$(elapsed)" -gt "$BUDGET" ]; }

# Every process this script started that may still run (killed at the end).
STARTED=
cleanup() {
	kill_tree $STARTED
	[ "${KEEP:-0}" = 1 ] && echo "kept $T" || rm -rf "$T" "$IMG"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- processes ---------------------------------------------------------------
# tree_of PID: PID and every descendant, one a line
tree_of() {
	ps -e -o pid=,ppid= | awk -v r="$1" '{ p[$1] = $2 }
		END { k[r] = 1; do { n = 0; for (c in p) if (!(c in k) && (p[c] in k)) { k[c] = 1; n = 1 } } while (n)
		      for (c in k) print c }'
}
# gone_within SECONDS PIDS...: 0 once none exists (zombies included: a
# zombie keeps its pid and criu restore fails "Can't fork for PID")
gone_within() {
	local to=$1 p i
	shift
	for p in "$@"; do
		for ((i = 0; i < to * 20; i++)); do [ -e "/proc/$p" ] || break; sleep 0.05; done
		[ -e "/proc/$p" ] && { GONE_WHY="pid $p still exists ($(ps -o stat=,comm= -p "$p" 2>/dev/null))"; return 1; }
	done
	return 0
}
# ended_within SECONDS PID: 0 once PID is gone or a zombie
ended_within() {
	local i
	for ((i = 0; i < $1 * 20; i++)); do live "$2" || return 0; sleep 0.05; done
	return 1
}
# wait_for FILE SECONDS PID: FILE exists (0); PID ended or the time ran out (1)
wait_for() {
	local i
	for ((i = 0; i < $2 * 20; i++)); do
		[ -e "$1" ] && return 0
		live "$3" || { sleep 0.2; [ -e "$1" ]; return; }
		sleep 0.05
	done
	return 1
}
# ours PID: a process of this run (its environment names this run's socket
# directory; a restored process keeps it): nothing else is ever killed
ours() { grep -qzxF "CUINTERPOSE_SOCKET_DIR=$T/sock" "/proc/$1/environ" 2>/dev/null; }
kill_tree() { # PIDS...: each with its descendants, those of this run
	local p c
	for p in "$@"; do
		for c in $(tree_of "$p"); do ours "$c" && kill -9 "$c" 2>/dev/null; done
	done
}
# the jobs' python with the jobs' libraries (not criu's Debian set)
PYRUN=(env LD_LIBRARY_PATH="$T/pylib" "$PY")
joblog() { tail -n "${2:-3}" "$OUT/$1.job.log" 2>/dev/null | cut -c1-300 | tr '\n' ' '; }

# launch NAME PRELOAD(0|1) KIND [ENV=VAL...] -- ARGS: start the job KIND
# (jax, ddp) in a session of its own, its files in W=$T/NAME; LAUNCHED is
# this shell's child (with PRELOAD, `cuinterpose run` execs into it)
launch() {
	local name=$1 pre=$2 kind=$3 envs=() launcher=() cmd=()
	shift 3
	while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
	[ "${1:-}" = -- ] && shift
	W=$T/$name
	rm -rf "$W"
	mkdir -p "$W"
	[ "$pre" = 1 ] && launcher=("$CLI" run --lib "$INTERPOSER" --)
	case $kind in
	jax) cmd=("$PY" "$S/frameworks/jaxjob.py" "$W" "$@") ;;
	hostmem) cmd=("$PY" "$S/frameworks/hostmem.py" "$W" "$@") ;;
	ddp) cmd=("$PY" -m torch.distributed.run --standalone --nproc_per_node=1 "$S/frameworks/ddpjob.py" "$W" "$@") ;;
	esac
	say "start $name: ${envs[*]} ${launcher[*]:+cuinterpose run} ${cmd[*]}"
	setsid env -u XLA_PYTHON_CLIENT_PREALLOCATE -u XLA_PYTHON_CLIENT_ALLOCATOR -u XLA_PYTHON_CLIENT_MEM_FRACTION \
		-u XLA_CLIENT_MEM_FRACTION LD_LIBRARY_PATH="$T/pylib" PYTHONUNBUFFERED=1 "${envs[@]}" "${launcher[@]}" \
		"${cmd[@]}" </dev/null >"$OUT/$name.job.log" 2>&1 &
	LAUNCHED=$!
	STARTED="$STARTED $LAUNCHED"
	disown "$LAUNCHED" # still reaped by bash, without a "Killed" line after each dump
}

# reference NAME KIND [ENV=VAL...] -- ARGS: the uninterrupted run without
# the interposer, its losses in $T/NAME/losses; false with WHY
reference() {
	local name=$1 kind=$2
	shift 2
	launch "$name" 0 "$kind" "$@"
	if ! wait_for "$W/done" "$TMO" "$LAUNCHED"; then
		WHY="reference run: no end within ${TMO}s: $(joblog "$name")"
		kill_tree "$LAUNCHED"
		wait "$LAUNCHED" 2>/dev/null
		return 1
	fi
	ended_within 60 "$LAUNCHED" || { kill_tree "$LAUNCHED"; say "$name: still running 60 s after its last step, killed"; }
	wait "$LAUNCHED" 2>/dev/null
	say "$name: $(wc -l <"$W/losses") steps, last: $(tail -n 1 "$W/losses")"
	cp "$W/losses" "$OUT/$name.losses" 2>/dev/null
	cp "$W/info" "$OUT/$name.info" 2>/dev/null
	return 0
}

# ---- criu --------------------------------------------------------------------
# keep_log NAME FILE: a filtered copy of a criu log in OUT/NAME (whole
# -v4 logs are MBs); with FAILED=1 its last 200 lines too
keep_log() {
	local b
	b=$(basename "$2" .log)
	[ -f "$2" ] || return 0
	mkdir -p "$OUT/$1"
	# with criu's milestones, whose timestamps split a dump or a restore
	# into criu's own steps around the plugin's
	grep -E "cuinterpose|cuda_plugin|cuda-checkpoint|Error|Warn|FAIL|pause:|finished successfully|Freezing tasks|Forking task with|Restore via sigreturn|Unlock network|Running post-|Dumping pages|Writing image" "$2" |
		head -n 3000 >"$OUT/$1/$b.log"
	[ "${FAILED:-0}" = 1 ] && grep -v "^(.*) \(unix\|fsnotify\|Dumping\|mnt\|ns\): " "$2" | tail -n 200 >"$OUT/$1/$b.tail.log"
	return 0
}
# guarded CMD...: CMD in the background, its status; while it runs, the
# image directory's filesystem keeps JOBS_MIN_FREE_MIB (4096) free, or every
# criu below CMD is killed (DISKFULL says so): no dump fills the disk
guarded() {
	local pid i c floor=${JOBS_MIN_FREE_MIB:-4096}
	"$@" &
	pid=$!
	DISKFULL=''
	for ((i = 0; ; i++)); do
		live "$pid" || break
		if [ $((i % 10)) = 0 ] && [ "$(df -Pk "$IMG" | awk 'NR == 2 {print int($4 / 1024)}')" -lt "$floor" ]; then
			DISKFULL="less than $floor MiB left free under $IMG while criu wrote the images: criu killed"
			say "$DISKFULL"
			for c in $(tree_of "$pid"); do
				[ "$(cat "/proc/$c/comm" 2>/dev/null)" = criu ] && ours "$c" && kill -9 "$c"
			done
			break
		fi
		sleep 0.05
	done
	wait "$pid"
}
# criu_plain dump|restore DIR PLUGINDIR [CRIU-ARGS...]: bounded plain criu
# (dump of ROOT's tree); SECS
criu_plain() {
	local what=$1 d=$2 pl=$3 t0 rc i
	shift 3
	mkdir -p "$d"
	t0=$(date +%s.%N)
	if [ "$what" = dump ]; then
		PATH=$T/shimbin:$PATH guarded "$BOUNDED" "$CRIU_TIMEOUT" "$CRIU" dump -t "$ROOT" -D "$d" -L "$pl" --link-remap \
			--display-stats -v4 -o dump.log "$@" >"$d.dump.txt" 2>&1
	else
		LAZY_T0=$t0
		if [ "${LAZY:-0}" = 1 ]; then
			# criu's lazy-pages daemon serves the job's host pages from the
			# images through userfaultfd: on a fault first, then the rest in
			# the background once criu's restore has finished
			"$BOUNDED" "$CRIU_TIMEOUT" "$CRIU" lazy-pages -D "$d" --display-stats -v4 -o lazy.log >"$d.lazy.txt" 2>&1 &
			LAZYPID=$!
			for ((i = 0; i < 200; i++)); do [ -S "$d/lazy-pages.socket" ] && break; live "$LAZYPID" || break; sleep 0.05; done
			[ -S "$d/lazy-pages.socket" ] || say "criu lazy-pages: no $d/lazy-pages.socket within 10 s: $(tail -n 2 "$d.lazy.txt" | tr '\n' ' ')"
			set -- "$@" --lazy-pages
		fi
		PATH=$T/shimbin:$PATH "$BOUNDED" "$CRIU_TIMEOUT" "$CRIU" restore -D "$d" -L "$pl" --restore-detached \
			--display-stats -v4 -o restore.log "$@" >"$d.restore.txt" 2>&1
	fi
	rc=$?
	SECS=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.2f", $1 - $2}')
	# criu's --display-stats (its freezing, memory dump and write times and
	# page counts; its forking and restore times), then its last lines
	sed -n '/Displaying/,$p' "$d.$what.txt" | sed "s/^/  criu $what stats: /"
	grep -v "Displaying\|time:\|pages \|Pages " "$d.$what.txt" | sed "s/^/  criu $what: /" | tail -n 5
	return $rc
}
# criu_cli dump|restore DIR PLUGINDIR: `cuinterpose checkpoint ROOT DIR` /
# `cuinterpose restore DIR`, the flags its own; SECS, its lines in DIR.WHAT.txt
criu_cli() {
	local what=$1 d=$2 pl=$3 t0 rc
	t0=$(date +%s.%N)
	if [ "$what" = dump ]; then
		PATH=$T/shimbin:$PATH guarded timeout -k 10 $((2 * CRIU_TIMEOUT + 60)) "$CLI" checkpoint --libdir "$pl" \
			--criu "$CRIU" --timeout "$CRIU_TIMEOUT" "$ROOT" "$d" >"$d.dump.txt" 2>&1
	else
		PATH=$T/shimbin:$PATH timeout -k 10 $((2 * CRIU_TIMEOUT + 60)) "$CLI" restore --libdir "$pl" \
			--criu "$CRIU" --timeout "$CRIU_TIMEOUT" "$d" >"$d.restore.txt" 2>&1
	fi
	rc=$?
	SECS=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.2f", $1 - $2}')
	grep -E "running:|--tcp-established|--shell-job|--link-remap|criu (succeeded|failed)|did not finish|warning" \
		"$d.$what.txt" | sed "s/^/  cli $what: /" | cut -c1-400
	return $rc
}

# lazy_done DIR: criu's lazy-pages daemon of the restore from DIR has ended
# (bounded by CRIU_TIMEOUT): LAZYLINE says when, from the restore's start,
# every host page of the job was in place, and how the daemon ended
lazy_done() {
	local rc n
	wait "$LAZYPID"
	rc=$?
	n=$(grep -ho "UFFD transferred pages: ([0-9]*/[0-9]*)" "$1/lazy.log" 2>/dev/null | tail -n 1)
	LAZYLINE="host pages all in place $(echo "$(date +%s.%N) $LAZY_T0" | awk '{printf "%.2f", $1 - $2}') s after the restore began (criu lazy-pages rc $rc${n:+, $n})"
	say "$name: $LAZYLINE"
}

# The plugin's lines of a dump (ours): SAVE summary, pause line, carried bytes.
dump_numbers() {
	SAVE=$(grep -ho "cuinterpose: SAVE: .*" "$1/dump.log" 2>/dev/null | tail -n 1 | sed 's/^cuinterpose: //')
	PAUSE=$(grep -ho "cuinterpose: pause: .*" "$1/dump.log" 2>/dev/null | tail -n 1 | sed 's/^cuinterpose: //')
	CARRIED=$(echo "$SAVE" | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^bytes,?$/) {print $(i - 1); exit}}')
	[ -n "$SAVE" ] && [ -z "$CARRIED" ] && CARRIED=0
}
gib() { awk -v b="$1" 'BEGIN {printf "%.2f GiB", b / 1073741824}'; }

gpu_used_mib() {
	timeout 30 nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n 1 | tr -dc '0-9'
}

# room_for MIB: the image directory's disk > 1.3x and the host's available
# memory > 1.1x MIB (upstream's native checkpoint copies every byte of the
# device to the host, then criu writes it); false with ROOM_WHY
room_for() {
	local mib=$1 disk_kib mem_kib
	disk_kib=$(df -Pk "$IMG" | awk 'NR == 2 {print $4}')
	mem_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
	if [ -z "$mib" ]; then
		ROOM_WHY="skipped: disk (the GPU memory in use is unknown: nvidia-smi did not answer)"
		return 1
	fi
	if [ "$(awk -v d="$disk_kib" -v m="$mib" 'BEGIN {print (d > 1.3 * m * 1024)}')" != 1 ]; then
		ROOM_WHY="skipped: disk ($((disk_kib / 1048576)) GiB free under $IMG, the GPU holds $((mib / 1024)) GiB: upstream would write it all)"
		return 1
	fi
	if [ "$(awk -v h="$mem_kib" -v m="$mib" 'BEGIN {print (h > 1.1 * m * 1024)}')" != 1 ]; then
		ROOM_WHY="skipped: host memory ($((mem_kib / 1048576)) GiB available, the GPU holds $((mib / 1024)) GiB: upstream copies it all to the host)"
		return 1
	fi
	return 0
}

# ---- one checkpointed run ------------------------------------------------------
# ckpt NAME MODE(ours|base) KIND REF VIA(criu|cli) [ENV=VAL...] -- ARGS: the
# job paused after step AT, dumped, restored, let go on, its losses against
# REF's. Writes one row and one block of jobs.txt.
ckpt() {
	local name=$1 mode=$2 kind=$3 ref=$4 via=$5 pre=0 pl=$T/base-plugins d pids gpu st detail first
	local pass=PASS fail=FAIL jx=
	shift 5
	[ "$mode" = ours ] && pre=1 pl=$T/plugins
	[ "$mode" = base ] && pass=UPSTREAM-PASS fail=UPSTREAM-FAILS
	d=$IMG/$name
	rm -rf "$d" "$d".*.txt
	SAVE='' PAUSE='' CARRIED='' SECS='' DUMP_S=- RESTORE_S=- IMG_MIB=- gpu='' LOAD='' FAILED=0 LAZYLINE=''
	local extra=()
	[ "$kind" = ddp ] && [ "$via" = criu ] && extra=("${NETFLAGS[@]}")
	local path_used="plain criu${extra[*]:+ ${extra[*]}}"
	[ "$via" = cli ] && path_used="cuinterpose checkpoint/restore"

	# finish STATUS WHY: the row, the block, the images gone, the job too
	finish_run() {
		local st=$1 why=$2
		[ "$st" = "$fail" ] && FAILED=1
		keep_log "$name" "$d/dump.log"
		keep_log "$name" "$d/restore.log"
		keep_log "$name" "$d/lazy.log"
		cp "$d".*.txt "$OUT/$name/" 2>/dev/null
		cp "$d/cuinterpose-criu-flags" "$OUT/$name/" 2>/dev/null
		cp "$W/losses" "$W/info" "$W/mem.1" "$W/paused.1" "$OUT/$name/" 2>/dev/null
		kill_tree $ROOT $pids
		rm -rf "$d" "$d".*.txt
		detail="$why; via $path_used; GPU ${gpu:-?} MiB in use at the pause${jx:+ ($jx)}"
		[ -n "$CARRIED" ] && detail="$detail; carried $(gib "$CARRIED")"
		detail="$detail; images $IMG_MIB MiB; dump ${DUMP_S}s; restore ${RESTORE_S}s"
		[ -n "$LAZYLINE" ] && detail="$detail; $LAZYLINE"
		[ -n "$PAUSE" ] && detail="$detail; $PAUSE"
		[ -n "$SAVE" ] && detail="$detail; $SAVE"
		[ "$st" = SKIP ] && detail="$why"
		result "$name" "$st" "$detail"
		{
			echo "$name ($([ "$mode" = ours ] && echo "ours, cuinterpose_plugin" || echo "upstream cuda_plugin, no interposer")): $st"
			echo "  $why"
			echo "  path: $path_used${CLIFLAGS:+ (the CLI picked: $CLIFLAGS)}"
			echo "  env: $(tr ' ' '\n' <<<"$ENVS" | grep . | tr '\n' ' ')"
			echo "  GPU memory in use at the pause: ${gpu:-?} MiB${jx:+; $jx}"
			echo "  carried: ${CARRIED:+$CARRIED bytes ($(gib "$CARRIED"))}${CARRIED:-n/a}; images: $IMG_MIB MiB"
			echo "  dump: ${DUMP_S} s; restore: ${RESTORE_S} s"
			[ -n "$LAZYLINE" ] && echo "  lazy pages: $LAZYLINE"
			echo "  pause: ${PAUSE:-none in dump.log}"
			echo "  SAVE: ${SAVE:-none in dump.log}"
			[ -n "$LOAD" ] && echo "  LOAD: $LOAD"
			echo
		} >>"$OUT/jobs.txt"
	}

	shift_envs "$@"
	say "== $name: paused after step $AT, dumped, restored ($path_used)"
	launch "$name" "$pre" "$kind" "$@" --pause-at "$AT"
	ROOT=$LAUNCHED pids='' CLIFLAGS=''
	if ! wait_for "$W/paused.1" "$TMO" "$LAUNCHED"; then
		finish_run "$fail" "no pause after step $AT within ${TMO}s: $(joblog "$name" 4)"
		wait "$LAUNCHED" 2>/dev/null
		return
	fi
	# the tree's root: the python (JAX) or torchrun's agent (DDP) that `cuinterpose run` became
	[ "$kind" = jax ] && ROOT=$(cat "$W/pid")
	[ "$kind" = ddp ] && ROOT=$(awk '{print $6}' "$W/paused.1")
	[ "$ROOT" = "$LAUNCHED" ] || say "$name: the tree's root $ROOT is not the launched pid $LAUNCHED"
	pids=$(tree_of "$ROOT" | tr '\n' ' ')
	gpu=$(gpu_used_mib)
	[ "$kind" = jax ] && jx=$(grep -o '"\(bytes_in_use\|bytes_reserved\|bytes_limit\|pool_bytes\|peak_bytes_in_use\)": [0-9]*' \
		"$W/mem.1" 2>/dev/null | awk -F': ' '{printf "%s%s %.0f MiB", (NR > 1 ? ", " : "JAX "), $1, $2 / 1048576}' | tr -d '"')
	[ "$kind" = ddp ] && jx=$(awk '{printf "torch allocated %.0f MiB, reserved %.0f MiB", $2 / 1048576, $4 / 1048576}' "$W/mem.1" 2>/dev/null)
	say "$name: paused ($(cat "$W/paused.1")); tree: $pids; GPU $gpu MiB; $jx"
	if [ "$mode" = base ] && ! room_for "$gpu"; then
		kill_tree "$ROOT" $pids
		wait "$LAUNCHED" 2>/dev/null
		finish_run SKIP "$ROOM_WHY"
		return
	fi

	if [ "$via" = cli ]; then criu_cli dump "$d" "$pl"; else criu_plain dump "$d" "$pl" "${extra[@]}"; fi
	st=$?
	DUMP_S=$SECS
	CLIFLAGS=$(cat "$d/cuinterpose-criu-flags" 2>/dev/null)
	[ "$mode" = ours ] && dump_numbers "$d"
	IMG_MIB=$(du -sm "$d" 2>/dev/null | cut -f1)
	if [ $st != 0 ]; then
		grep -v "^(.*) \(unix\|fsnotify\|Dumping\|mnt\|ns\): " "$d/dump.log" 2>/dev/null | tail -n 15 | cut -c1-300 | sed 's/^/  dump.log: /'
		finish_run "$fail" "dump failed (rc $st${DISKFULL:+: $DISKFULL}): $(grep -hE "Error|cuinterpose:.*(refus|fail)|cuda_plugin.*(fail|rror)" "$d/dump.log" 2>/dev/null | tail -n 3 | cut -c1-300 | tr '\n' ' ')"
		ended_within 5 "$LAUNCHED" && wait "$LAUNCHED" 2>/dev/null
		return
	fi
	say "$name: dumped in ${DUMP_S}s, $IMG_MIB MiB of images${CARRIED:+, $(gib "$CARRIED") carried}"
	[ -n "$PAUSE" ] && say "$name: $PAUSE"
	[ -n "$SAVE" ] && say "$name: $SAVE"
	if ended_within 10 "$LAUNCHED"; then wait "$LAUNCHED" 2>/dev/null; fi # our child: reaped
	if ! gone_within 10 $pids; then
		finish_run "$fail" "after the dump: $GONE_WHY"
		return
	fi

	if [ "$via" = cli ]; then criu_cli restore "$d" "$pl"; else criu_plain restore "$d" "$pl" "${extra[@]}"; fi
	st=$?
	RESTORE_S=$SECS
	LOAD=$(grep -ho "cuinterpose: LOAD: .*" "$d/restore.log" 2>/dev/null | tail -n 1 | sed 's/^cuinterpose: //')
	if [ $st != 0 ]; then
		grep -v "^(.*) \(unix\|fsnotify\|mnt\|ns\): " "$d/restore.log" 2>/dev/null | tail -n 15 | cut -c1-300 | sed 's/^/  restore.log: /'
		finish_run "$fail" "restore failed (rc $st): $(grep -hE "Error|cuinterpose:.*fail|cuda_plugin.*(fail|rror)" "$d/restore.log" 2>/dev/null | tail -n 3 | cut -c1-300 | tr '\n' ' ')"
		return
	fi
	say "$name: restored in ${RESTORE_S}s${LOAD:+; $LOAD}"
	touch "$W/go.1"
	[ "${LAZY:-0}" = 1 ] && lazy_done "$d"
	if ! wait_for "$W/done" "$TMO" "$ROOT"; then
		finish_run "$fail" "no end after the restore within ${TMO}s: $(joblog "$name" 4)"
		return
	fi
	ended_within 60 "$ROOT" || say "$name: still running 60 s after its last step (killed)"
	if cmp -s "$T/$ref/losses" "$W/losses"; then
		finish_run "$pass" "$(wc -l <"$W/losses") losses bit-identical to the uninterrupted run (dumped after step $AT)"
		return
	fi
	first=$(diff "$T/$ref/losses" "$W/losses" | grep -m1 -o '^[<>] step [0-9]*' | grep -o '[0-9]*$')
	if [ -n "$first" ] && [ "$first" -le "$AT" ]; then
		finish_run "$fail" "losses differ from step $first, before the dump: the job is not deterministic from run to run (or the interposer changes it): $(diff "$T/$ref/losses" "$W/losses" | head -n 4 | tr '\n' ' ')"
	else
		finish_run "$fail" "losses differ after the restore (first at step ${first:-?}; $(wc -l <"$W/losses") of $STEPS steps): $(diff "$T/$ref/losses" "$W/losses" | head -n 4 | tr '\n' ' ')"
	fi
}
# ENVS: the ENV=VAL words before -- (for jobs.txt)
shift_envs() {
	ENVS=
	while [ $# -gt 0 ] && [ "$1" != -- ]; do ENVS="$ENVS $1"; shift; done
}

# ---- JAX -------------------------------------------------------------------------
variant_env() {
	case $1 in
	prealloc) echo "" ;;
	noprealloc) echo "XLA_PYTHON_CLIENT_PREALLOCATE=false" ;;
	async) echo "XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async" ;;
	*) return 1 ;;
	esac
}

# The XLA_FLAGS for bit-identical runs that this JAX accepts (an unknown
# flag aborts XLA): probed on the CPU backend, without the GPU.
jax_flags() {
	local f
	for f in "--xla_gpu_deterministic_ops=true --xla_gpu_autotune_level=0" \
		"--xla_gpu_exclude_nondeterministic_ops=true --xla_gpu_autotune_level=0" "--xla_gpu_autotune_level=0"; do
		if XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }$f" JAX_PLATFORMS=cpu timeout 120 "${PYRUN[@]}" -c \
			'import jax.numpy as jnp; print("ok", int((jnp.arange(3.0) @ jnp.arange(3.0)).item()))' 2>/dev/null | grep -q '^ok 5$'; then
			echo "${XLA_FLAGS:+$XLA_FLAGS }$f"
			return 0
		fi
	done
	echo "${XLA_FLAGS:-}"
}

run_jax() {
	local v envs e flags
	if ! e=$(timeout 120 "${PYRUN[@]}" -c 'import jax, jaxlib; print(jax.__version__)' 2>"$T/import.err"); then
		for v in $JAX_VARIANTS; do result "jax-$v" FAIL "jax does not import in $PY: $(tail -n 2 "$T/import.err" | tr '\n' ' ')"; done
		return
	fi
	flags=$(jax_flags)
	say "jax $e; XLA_FLAGS for the jobs: '$flags'"
	echo "jax $e, XLA_FLAGS '$flags', $STEPS steps, dumped after step $AT" >>"$OUT/jobs.txt"
	for v in $JAX_VARIANTS; do
		if ! envs=$(variant_env "$v"); then
			result "jax-$v" FAIL "unknown JAX variant '$v' (prealloc, noprealloc, async)"
			continue
		fi
		# shellcheck disable=SC2206 # $envs: zero or more ENV=VAL words
		local args=(JAX_PLATFORMS=cuda "XLA_FLAGS=$flags" $envs -- --steps "$STEPS" --ballast-mib "${JAX_BALLAST_MIB:-1024}")
		if past_budget; then
			result "jax-$v" SKIP "not run: past the budget (${BUDGET}s)"
			continue
		fi
		say "== jax-$v (${envs:-the JAX defaults}): reference run"
		if ! reference "jax-$v-ref" jax "${args[@]}"; then
			result "jax-$v" FAIL "$WHY"
			result "jax-$v-base" SKIP "no reference run"
			continue
		fi
		ckpt "jax-$v" ours jax "jax-$v-ref" criu "${args[@]}"
		case " $JAX_LAZY " in
		*" $v "*)
			if past_budget; then
				result "jax-$v-lazy" SKIP "not run: past the budget (${BUDGET}s)"
			else
				LAZY=1 ckpt "jax-$v-lazy" ours jax "jax-$v-ref" criu "${args[@]}"
			fi
			;;
		esac
		# criu alone restoring as much host memory as this job's restore did
		if [ "$v" = prealloc ] && [ "${JOBS_HOSTMEM:-1}" = 1 ]; then
			local pages
			pages=$(sed -n 's/^Pages restored: \([0-9]*\).*/\1/p' "$OUT/jax-$v/jax-$v.restore.txt" 2>/dev/null | head -n 1)
			if [ -z "$pages" ]; then
				result hostmem SKIP "jax-$v's restore gave no page count"
			elif past_budget; then
				result hostmem SKIP "not run: past the budget (${BUDGET}s)"
			else
				run_hostmem $((pages / 256)) "jax-$v"
				LAZY=1 run_hostmem $((pages / 256)) "jax-$v"
			fi
		fi
		[ "${JOBS_BASE:-1}" = 1 ] || continue
		if [ ! -f "$T/base-plugins/cuda_plugin.so" ]; then
			result "jax-$v-base" SKIP "no baseline/cuda_plugin.so in the bundle"
		elif past_budget; then
			result "jax-$v-base" SKIP "not run: past the budget (${BUDGET}s)"
		else
			ckpt "jax-$v-base" base jax "jax-$v-ref" criu "${args[@]}"
		fi
	done
}

# run_hostmem MIB JOB: hostmem.py holding MIB of 0xFF host memory, no CUDA,
# dumped and restored by plain criu without a plugin: criu's own time for
# the host memory that JOB's restore brought back (its page count)
run_hostmem() {
	local mib=$1 job=$2 name=hostmem${LAZY:+-lazy} st why stats d
	d=$IMG/$name
	LAZYLINE=''
	say "== hostmem: $mib MiB of host memory, no GPU, as much as $job's restore brought back"
	mkdir -p "$T/noplugins"
	launch "$name" 0 hostmem -- --mib "$mib"
	if ! wait_for "$W/paused.1" "$TMO" "$LAUNCHED"; then
		result "$name" FAIL "no pause within ${TMO}s: $(joblog "$name" 4)"
		kill_tree "$LAUNCHED"
		wait "$LAUNCHED" 2>/dev/null
		return
	fi
	ROOT=$(cat "$W/pid")
	DUMP_S=- RESTORE_S=- why=''
	if ! criu_plain dump "$d" "$T/noplugins"; then
		why="dump failed: $(grep -h Error "$d/dump.log" 2>/dev/null | tail -n 2 | tr '\n' ' ')"
	else
		DUMP_S=$SECS
		ended_within 10 "$LAUNCHED" && wait "$LAUNCHED" 2>/dev/null
		if ! gone_within 10 "$ROOT"; then
			why="after the dump: $GONE_WHY"
		elif ! criu_plain restore "$d" "$T/noplugins"; then
			why="restore failed: $(grep -h Error "$d/restore.log" 2>/dev/null | tail -n 2 | tr '\n' ' ')"
		else
			RESTORE_S=$SECS
			touch "$W/go.1"
			[ "${LAZY:-0}" = 1 ] && lazy_done "$d"
			wait_for "$W/done" "$TMO" "$ROOT" || why="no end after the restore within ${TMO}s: $(joblog "$name" 4)"
		fi
	fi
	stats=$(sed -n 's/^\(Pages restored\|Restore time\): \([0-9]*\).*/\2/p' "$d.restore.txt" 2>/dev/null | tr '\n' ' ')
	kill_tree "$ROOT"
	rm -rf "$d" "$d".*.txt
	if [ -n "$why" ]; then
		result "$name" FAIL "$why"
	elif [ "$(cut -d' ' -f1 "$W/done")" != ok ]; then
		result "$name" FAIL "bytes differ after the restore: $(cat "$W/done")"
	else
		# shellcheck disable=SC2086 # $stats: pages, then microseconds
		set -- $stats
		result "$name" PASS "criu alone (no GPU, no plugin): $mib MiB of 0xFF host memory, every byte back; dump ${DUMP_S}s; restore ${RESTORE_S}s${LAZYLINE:+; $LAZYLINE}; criu's Pages restored ${1:-?}, Restore time ${2:-?} us ($(awk -v p="${1:-0}" -v u="${2:-0}" 'BEGIN {if (u > 0) printf "%.2f GB/s", p * 4096 / u / 1000; else printf "?"}'))"
	fi
}

# ---- torchrun + DDP ------------------------------------------------------------------
run_ddp() {
	local e via=criu
	if ! e=$(timeout 120 "${PYRUN[@]}" -c 'import torch, torch.distributed.run; print(torch.__version__, "NCCL", torch.cuda.nccl.version() if torch.cuda.is_available() else "no CUDA")' 2>"$T/import.err"); then
		result ddp FAIL "torch does not import in $PY: $(tail -n 2 "$T/import.err" | tr '\n' ' ')"
		return
	fi
	# criu's network lock for the explicit flags: nftables, as the GPU
	# machine has no iptables; iptables only where criu lacks nftables
	NETFLAGS=(--tcp-established --network-lock nftables)
	if ! timeout 20 "$CRIU" check --feature network_lock_nftables >/dev/null 2>&1 && command -v iptables-restore >/dev/null; then
		NETFLAGS=(--tcp-established)
	fi
	# the CLI picks --tcp-established and the lock itself when it records them
	if grep -aqF cuinterpose-criu-flags "$CLI" && "$CLI" checkpoint --help >/dev/null 2>&1; then via=cli; fi
	say "torch $e; ddp via $via; explicit criu flags: ${NETFLAGS[*]}"
	echo "torch $e; ddp dumped via $([ $via = cli ] && echo "cuinterpose checkpoint/restore (the CLI picks the TCP flags)" || echo "plain criu ${NETFLAGS[*]}")" >>"$OUT/jobs.txt"
	# NCCL on loopback, no InfiniBand device nor net plugin: nothing criu cannot dump
	local args=(NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_NET_PLUGIN=none NCCL_DEBUG=WARN -- --steps "$STEPS")
	if past_budget; then
		result ddp SKIP "not run: past the budget (${BUDGET}s)"
		return
	fi
	say "== ddp: reference run"
	if ! reference ddp-ref ddp "${args[@]}"; then
		result ddp FAIL "$WHY"
		return
	fi
	ckpt ddp ours ddp ddp-ref "$via" "${args[@]}"
	[ "${JOBS_BASE:-1}" = 1 ] || return
	if [ ! -f "$T/base-plugins/cuda_plugin.so" ]; then
		result ddp-base SKIP "no baseline/cuda_plugin.so in the bundle"
	elif past_budget; then
		result ddp-base SKIP "not run: past the budget (${BUDGET}s)"
	else
		ckpt ddp-base base ddp ddp-ref criu "${args[@]}"
	fi
}

{
	echo "cuinterpose jobs (issue #46), $(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -r)"
	echo "GPU: $(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
	echo "criu: $("$CRIU" --version 2>&1 | head -n 1); images under $IMG ($(df -Ph "$IMG" | awk 'NR == 2 {print $4}') free)"
	echo
} >>"$OUT/jobs.txt"
NETFLAGS=()
want jax && run_jax
if want hostmem; then
	run_hostmem "${JOBS_HOSTMEM_MIB:-4096}" JOBS_HOSTMEM_MIB
	LAZY=1 run_hostmem "${JOBS_HOSTMEM_MIB:-4096}" JOBS_HOSTMEM_MIB
fi
want ddp && run_ddp
echo "== summary"
cat "$OUT/summary.txt"
echo "== per run"
cat "$OUT/jobs.txt"
! grep -qP '\tFAIL\t' "$OUT/summary.txt"
