#!/usr/bin/env bash
# forked.sh - processes forked from CUDA processes, through checkpoints, on
# the GPU machine, with a bundle (test/gpu/bundle.sh):
#
#   bundle/scripts/forked.sh [--out DIR] [--only dl-persist,dl-fresh,compile,dl-precopy,dl-release,dl-incr,base]
#
# Each job is frameworks/trainjob.py (a deterministic PyTorch training job),
# started as the README says (`cuinterpose run --`), and run twice: straight
# through (the reference losses), then paused every 10 steps for a criu dump
# and restore (two cycles), its losses compared bit for bit:
#   dl-persist  DataLoader(num_workers=2, pin_memory=True, persistent
#               workers), a helper forked after CUDA init that sleeps (it
#               answers cuInit after each restore as before the first dump),
#               a helper that initializes NVML only (forked before CUDA)
#   dl-fresh    the same loader without persistent workers: the cycles fall
#               in two epochs, each with workers of its own
#   compile     torch.compile (Inductor) without workers
#   dl-precopy  dl-persist with `cuinterpose precopy` at each pause and the
#               dump against it (CUINTERPOSE_PARENT)
#   dl-release  dl-fresh's loader with CUINTERPOSE_RELEASE=torch: the caching
#               allocator emptied before each dump (each row gives the MiB
#               carried against torch's allocated and reserved at the pause)
#   dl-incr     dl-persist's job dumped with --leave-running at pause 1 and at
#               pause 2 (ten optimizer steps later) twice: against the first
#               (CUINTERPOSE_PARENT) and whole. The incremental dump's written
#               bytes against the 1 MiB blocks that differ between the two
#               whole dumps' carrier files (target: at most those plus 5% of
#               the carried bytes); the losses against the uninterrupted run
#   base        dl-persist through CRIU's upstream cuda_plugin, no interposer
# Results: one line per job (PASS/FAIL/what upstream did) in DIR/summary.txt,
# the criu logs under DIR/JOB/. Every criu call is bounded (bin/bounded).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=$(cd "$(dirname "$0")" && pwd)
# stat_state, live: beside this script in a bundle, in test/e2e in the tree
. "$S/procstate.sh" 2>/dev/null || . "$S/../e2e/procstate.sh" || exit 2
BUNDLE=$(cd "$S/.." && pwd)
OUT=
ONLY=dl-persist,dl-fresh,compile,dl-precopy,dl-release,dl-incr,base
while [ $# -gt 0 ]; do
	case $1 in
	--out) OUT=$2; shift ;;
	--only) ONLY=$2; shift ;;
	*) echo "forked.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done
# Below a subreaper (PID 1 there may not reap): the dumped job's children
# become zombies that keep their pids and sessions (the restore then fails
# "Can't fork for PID: File exists").
if [ -z "${CUIP_GPU_REAPED:-}" ]; then
	export CUIP_GPU_REAPED=1
	exec "$BUNDLE/workloads/e2e_reaper" bash "$0" --only "$ONLY" ${OUT:+--out "$OUT"}
fi
T=$(mktemp -d /tmp/cuip-forked.XXXXXX)
OUT=${OUT:-$T/out}
mkdir -p "$OUT" "$T/plugins" "$T/base-plugins" "$T/sock" "$T/shimbin" "$T/pylib"
export CUINTERPOSE_SOCKET_DIR=$T/sock
export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} # criu's and the CLI's libraries
CRIU=$BUNDLE/bin/criu
BOUNDED=$BUNDLE/bin/bounded
INTERPOSER=$BUNDLE/lib/libcuinterpose.so
ln -s "$BUNDLE/plugins/cuinterpose_plugin.so" "$T/plugins/"
ln -s "$BUNDLE/baseline/cuda_plugin.so" "$T/base-plugins/"
command -v cuda-checkpoint >/dev/null || ln -s "$BUNDLE/workloads/cuda-checkpoint-shim" "$T/shimbin/cuda-checkpoint"
# The job gets only the bundle's libraries the interposer and CLI need.
ldd "$INTERPOSER" "$BUNDLE/bin/cuinterpose" 2>/dev/null | awk -v b="$BUNDLE/lib/" 'index($3, b) == 1 {print $3}' |
	sort -u | xargs -r ln -sf -t "$T/pylib"
want() { case ",$ONLY," in *,"$1",*) return 0 ;; esac; return 1; }
say() { echo "[$(date +%T)] $*"; }
result() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$OUT/summary.txt"; say "RESULT $1: $2 $3"; }

# job NAME PRELOAD(0|1) ARGS...: start trainjob.py in a session of its own
job() {
	local name=$1 pre=$2 launcher=()
	shift 2
	[ "$pre" = 1 ] && launcher=("$BUNDLE/bin/cuinterpose" run --lib "$INTERPOSER" --)
	mkdir -p "$T/$name"
	setsid env LD_LIBRARY_PATH="$T/pylib" PYTHONUNBUFFERED=1 ${JOBENV:-} "${launcher[@]}" python3 \
		"$S/frameworks/trainjob.py" "$T/$name" "$@" </dev/null >"$OUT/$name.job.log" 2>&1 &
	JOBPID=$!
	LAUNCHED=$! # this shell's child: reaped after a dump ends it
}

# wait_file FILE SECONDS: the job wrote FILE (0), or it died / time ran out
wait_file() {
	local i
	for ((i = 0; i < $2 * 20; i++)); do
		[ -e "$1" ] && return 0
		kill -0 "$JOBPID" 2>/dev/null || [ -n "${RESTORED:-}" ] || return 1
		sleep 0.05
	done
	return 1
}

alive() { kill -0 "$1" 2>/dev/null; }

# criu_do dump|restore DIR PLUGINDIR: bounded (LEAVE=1: the job runs on)
criu_do() {
	local what=$1 d=$2 pl=$3 rc t0
	t0=$(date +%s.%N)
	if [ "$what" = dump ]; then
		PATH=$T/shimbin:$PATH "$BOUNDED" 300 "$CRIU" dump -t "$JOBPID" -D "$d" -L "$pl" --link-remap -v4 \
			-o dump.log ${LEAVE:+--leave-running}
	else
		PATH=$T/shimbin:$PATH "$BOUNDED" 300 "$CRIU" restore -D "$d" -L "$pl" --restore-detached -v4 \
			-o restore.log
	fi
	rc=$?
	SECS=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.2f", $1 - $2}')
	return $rc
}

drop_images() { find "$1" -type f ! -name '*.log' -delete 2>/dev/null; }

# cycle NAME K PLUGINDIR: dump at pause K, restore, let it go on
cycle() {
	local name=$1 k=$2 pl=$3 d=$T/$1/img.$2 kids
	wait_file "$T/$name/paused.$k" 300 || { WHY="no pause $k: $(tail -n 3 "$OUT/$name.job.log" | tr '\n' ' ')"; return 1; }
	kids=$(cat "$T/$name/paused.$k")
	mkdir -p "$d" "$OUT/$name"
	local parent=
	if [ -n "${PRECOPY:-}" ]; then
		# a live pre-copy of the paused job, then the dump against it
		parent=$T/$name/pre.$k
		local t0=$(date +%s.%N)
		"$BUNDLE/bin/cuinterpose" precopy --timeout 300 "$JOBPID" "$parent" >"$OUT/$name/precopy.$k" 2>&1 ||
			{ WHY="precopy $k failed: $(tail -n 3 "$OUT/$name/precopy.$k" | tr '\n' ' ')"; return 1; }
		PRE="$PRE $(echo "$(date +%s.%N) $t0" | awk '{printf "%.2f", $1 - $2}')"
		sed "s/^/  precopy $k: /" "$OUT/$name/precopy.$k"
	fi
	CUINTERPOSE_PARENT=$parent criu_do dump "$d" "$pl"
	local rc=$?
	[ -n "$parent" ] && grep -h "left to the parent" "$d/dump.log" | sed "s/^.*cuinterpose: /  dump $k: /"
	cp "$d/dump.log" "$OUT/$name/dump.$k.log" 2>/dev/null
	grep -E "forked after cuInit|NVML only|Error" "$d/dump.log" | head -n 8 | sed "s/^/  dump $k: /"
	if [ $rc != 0 ]; then
		grep -v "^(.*) \(unix\|fsnotify\|Dumping\|mnt\|ns\): " "$d/dump.log" | tail -n 25 | sed "s/^/  dump.log: /" | cut -c1-300
		WHY="dump $k failed (rc $rc, $kids): $(grep -m2 Error "$d/dump.log" | tr '\n' ' ')"
		return 1
	fi
	DUMPS="$DUMPS ${SECS}"
	# carried bytes (the SAVE line) against torch's allocated bytes at the pause
	CARRIED="$CARRIED $(grep -ho "SAVE: [0-9]* participants, [0-9]* records, [0-9]* bytes" "$d/dump.log" |
		awk '{printf "%.0f", $6 / 1048576}')/$(awk '{printf "%.0f/%.0f", $2 / 1048576, $4 / 1048576}' "$T/$name/mem.$k" 2>/dev/null)"
	[ "$k" = 1 ] && wait "$LAUNCHED" 2>/dev/null # the dumped root was this shell's child
	# every pid of the tree free again (the subreaper reaps the children)
	for pid in $JOBPID $(cut -d' ' -f4- "$T/$name/paused.$k"); do
		for ((i = 0; i < 200; i++)); do [ -e "/proc/$pid" ] || break; sleep 0.05; done
		[ -e "/proc/$pid" ] && { WHY="pid $pid still exists after dump $k ($(ps -o stat=,comm= -p "$pid"))"; return 1; }
	done
	RESTORED=1
	criu_do restore "$d" "$pl"
	rc=$?
	cp "$d/restore.log" "$OUT/$name/restore.$k.log" 2>/dev/null
	drop_images "$d"
	[ -n "$parent" ] && drop_images "$parent"
	[ $rc = 0 ] || tail -n 25 "$OUT/$name/restore.$k.log" | sed "s/^/  restore.log: /" | cut -c1-300
	[ $rc = 0 ] || { WHY="restore $k failed (rc $rc): $(grep -m2 Error "$d/restore.log" | tr '\n' ' ')"; return 1; }
	RESTORES="$RESTORES ${SECS}"
	if [ -n "$HELPER" ]; then # the forked helper's cuInit after the restore
		kill -USR1 "$HELPER"
		sleep 1
		HA="$HA $(tail -n 1 "$T/$name/helper.log" 2>/dev/null)"
	fi
	touch "$T/$name/go.$k"
	return 0
}

# ended PID: the process is gone or a zombie (a child not yet waited for)
ended() { ! live "$1"; }

# reference NAME PRELOAD ARGS...: the uninterrupted run of scenario NAME (its
# losses in $T/NAME-ref), its exit waited for at most 60 s after its last
# step; false with WHY otherwise
reference() {
	local ref=$1-ref pre=$2 i
	shift 2
	say "== ${ref%-ref}: reference run"
	job "$ref" "$pre" "$@"
	wait_file "$T/$ref/done" 600 || { WHY="reference run: $(tail -n 3 "$OUT/$ref.job.log" | tr '\n' ' ')"; return 1; }
	for ((i = 0; i < 1200; i++)); do ended "$JOBPID" && break; sleep 0.05; done
	ended "$JOBPID" || { kill -9 "$JOBPID"; WHY="reference run: still running 60 s after its last step"; return 1; }
	wait "$JOBPID" 2>/dev/null
	return 0
}

# same_losses NAME: its losses equal its reference run's; false with WHY
same_losses() {
	cmp -s "$T/$1-ref/losses" "$T/$1/losses" && return 0
	WHY="losses differ from the uninterrupted run: $(diff "$T/$1-ref/losses" "$T/$1/losses" | head -n 4 | tr '\n' ' ')"
	return 1
}

# scenario NAME PRELOAD PLUGINDIR ARGS...: reference run, then two cycles
scenario() {
	local name=$1 pre=$2 pl=$3 hb ha
	shift 3
	FAILED=FAIL
	[ "$name" = base ] && FAILED=UPSTREAM-FAILS
	DUMPS= RESTORES= WHY= RESTORED= CARRIED= PRE=
	reference "$name" "$pre" "$@" || { result "$name" $FAILED "$WHY"; return; }
	say "== $name: two checkpoint cycles"
	job "$name" "$pre" --pause-every 10 "$@"
	wait_file "$T/$name/paused.1" 600 || { result "$name" $FAILED "no first pause: $(tail -n 3 "$OUT/$name.job.log" | tr '\n' ' ')"; return; }
	HELPER= HA= hb=
	if [[ " $* " == *" --fork-helper "* ]]; then
		HELPER=$(awk '{print $NF}' "$T/$name/pids")
		kill -USR1 "$HELPER"
		sleep 1
		hb=$(tail -n 1 "$T/$name/helper.log" 2>/dev/null)
		echo "  the forked helper $HELPER before the dump: $hb"
	fi
	JOBPID=$(awk '{print $1}' "$T/$name/pids") # python, the tree's root under cuinterpose run's exec
	if ! cycle "$name" 1 "$pl" || ! cycle "$name" 2 "$pl"; then
		result "$name" $FAILED "$WHY"
		pkill -9 -s "$(ps -o sid= -p "$JOBPID" 2>/dev/null | tr -d ' ')" 2>/dev/null
		return
	fi
	if ! wait_file "$T/$name/done" 600; then
		result "$name" $FAILED "did not finish after the restores: $(tail -n 3 "$OUT/$name.job.log" | tr '\n' ' ')"
		return
	fi
	if [ -n "$hb" ] && [ "$HA" != " $hb $hb" ]; then
		result "$name" $FAILED "the forked helper answered cuInit '$hb' before the dump and '$HA' after the restores"
		return
	fi
	same_losses "$name" || { result "$name" $FAILED "$WHY"; return; }
	result "$name" PASS "$(wc -l <"$T/$name/losses") losses bit-identical to the uninterrupted run; ${PRE:+precopy s:$PRE; }dump s:$DUMPS; restore s:$RESTORES; MiB carried/allocated/reserved:$CARRIED; children at the pauses: $(cut -d' ' -f4- "$T/$name/paused.1" | wc -w), $(cut -d' ' -f4- "$T/$name/paused.2" | wc -w)${hb:+; forked helper: $hb before, $HA after}$( [ -f "$T/$name/nvml.log" ] && echo "; nvml helper: $(tail -n 1 "$T/$name/nvml.log")")"
}

# incr NAME ARGS...: the dl-incr measurement (see the top)
incr() {
	local name=$1 d1 d2 d2f line r
	shift
	reference "$name" 1 "$@" || { result "$name" FAIL "$WHY"; return; }
	say "== $name: dumps at pauses 1 and 2, the job running on"
	job "$name" 1 --pause-every 10 "$@"
	d1=$T/$name/d1 d2=$T/$name/d2 d2f=$T/$name/d2f
	mkdir -p "$d1" "$d2" "$d2f" "$OUT/$name"
	incr_fail() {
		result "$name" FAIL "$1"
		pkill -9 -s "$(ps -o sid= -p "$JOBPID" 2>/dev/null | tr -d ' ')" 2>/dev/null
	}
	wait_file "$T/$name/paused.1" 600 || { incr_fail "no first pause: $(tail -n 3 "$OUT/$name.job.log" | tr '\n' ' ')"; return; }
	JOBPID=$(awk '{print $1}' "$T/$name/pids")
	LEAVE=1 criu_do dump "$d1" "$T/plugins" || { incr_fail "dump 1: $(grep -m2 Error "$d1/dump.log" | tr '\n' ' ')"; return; }
	touch "$T/$name/go.1"
	wait_file "$T/$name/paused.2" 600 || { incr_fail "no second pause: $(tail -n 3 "$OUT/$name.job.log" | tr '\n' ' ')"; return; }
	LEAVE=1 CUINTERPOSE_PARENT=$d1 criu_do dump "$d2" "$T/plugins" ||
		{ incr_fail "dump 2 against dump 1: $(grep -m2 Error "$d2/dump.log" | tr '\n' ' ')"; return; }
	local s2=$SECS
	LEAVE=1 criu_do dump "$d2f" "$T/plugins" || { incr_fail "dump 2, whole: $(grep -m2 Error "$d2f/dump.log" | tr '\n' ' ')"; return; }
	touch "$T/$name/go.2"
	cp "$d1/dump.log" "$OUT/$name/dump.1.log"
	cp "$d2/dump.log" "$OUT/$name/dump.2.log"
	wait_file "$T/$name/done" 600 || { incr_fail "did not finish after the dumps: $(tail -n 3 "$OUT/$name.job.log" | tr '\n' ' ')"; return; }
	same_losses "$name" || { result "$name" FAIL "$WHY"; return; }
	# "SAVE: LEFT of CARRIED carried bytes left to the parent checkpoint D, WRITTEN written"
	line=$(grep -ho "SAVE: [0-9]* of [0-9]* carried bytes left to the parent checkpoint [^,]*, [0-9]* written" "$d2/dump.log" | tail -n 1)
	[ -n "$line" ] || { result "$name" FAIL "dump 2 has no SAVE summary against its parent"; return; }
	r=$(python3 - "$d1" "$d2f" $(echo "$line" | awk '{print $2, $4, $(NF - 1)}') "$s2" <<'PY'
import glob, os, sys
d1, d2f, left, carried, written, secs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6]), sys.argv[6]
B = 1 << 20
total = changed = zero = 0
for f2 in sorted(glob.glob(os.path.join(d2f, "cuinterpose-carrier-*.img"))):
    f1 = os.path.join(d1, os.path.basename(f2))
    a = open(f1, "rb") if os.path.exists(f1) else None
    with open(f2, "rb") as b:
        while True:
            y = b.read(B)
            if not y:
                break
            x = a.read(B) if a else b""
            total += 1
            changed += x != y
            zero += y.count(0) == len(y)
    if a:
        a.close()
limit = changed * B + carried // 20
print("MET" if written <= limit else "MISSED",
      "dump 2 wrote %d of %d carried bytes (%.1f%%; %d left to dump 1) in %s s; the whole dumps' carrier "
      "files differ in %d of %d 1 MiB blocks (%.1f%%, %d zero): target <= %d bytes (changed + 5%%)"
      % (written, carried, 100.0 * written / max(carried, 1), left, secs, changed, total,
         100.0 * changed / max(total, 1), zero, limit), sep="\t")
PY
)
	result "$name" "${r%%$'\t'*}" "${r#*$'\t'}"
	rm -rf "$d1" "$d2" "$d2f"
}

# The helper's answer after a restore: asked in the second cycle's pause.
want dl-persist && scenario dl-persist 1 "$T/plugins" --workers 2 --persistent --fork-helper --nvml-helper
want dl-fresh && scenario dl-fresh 1 "$T/plugins" --workers 2
want compile && scenario compile 1 "$T/plugins" --workers 0 --compile
# the caching allocator emptied before each dump (CUINTERPOSE_RELEASE=torch):
# the losses must not change, and fewer bytes are carried
# each dump against a live pre-copy made at the pause (workers and helpers alive)
want dl-precopy && PRECOPY=1 scenario dl-precopy 1 "$T/plugins" --workers 2 --persistent --fork-helper --nvml-helper
want dl-release && JOBENV=CUINTERPOSE_RELEASE=torch scenario dl-release 1 "$T/plugins" --workers 2
want dl-incr && incr dl-incr --workers 2 --persistent
want base && scenario base 0 "$T/base-plugins" --workers 2 --persistent --fork-helper --nvml-helper
echo "== summary"
cat "$OUT/summary.txt"
rm -rf "$T"
