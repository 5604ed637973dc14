# fw.sh - the real-framework part of the GPU suite (run.sh --only fw), sourced
# by run.sh, whose helpers (cmd, answers, criu_do, wait_gone, scenario,
# result) it uses. The jobs are test/gpu/frameworks/fwjob.py, started the way
# the README tells users to: `cuinterpose run -- python3 job.py`, dumped with
# `--link-remap` (multiprocessing's semaphores are unlinked /dev/shm files).
#
#  fw-torch-ipc       3 processes, torch.multiprocessing CUDA IPC (default
#                     caching allocator), two cycles
#  fw-torch-exp       the same with expandable segments (cuMem POSIX FDs taken
#                     with pidfd_getfd)
#  fw-torch-async     PyTorch's cudaMallocAsync backend (a private pool)
#  fw-llm             a GPT-2-shaped transformers model + FW_CACHE_MIB of cache;
#                     greedy generation token-identical after each restore
#  fw-cupy-ipc        CuPy cudaIpc* among 3 processes
#  fw-cupy-small      FW_ARRAYS small CuPy arrays: device memory under the
#                     interposer against the same job without it, then two cycles
#  fw-torch-ipc-precopy, fw-llm-precopy
#                     the torch IPC and LLM jobs, each dump against a live
#                     `cuinterpose precopy` made just before (a generation
#                     between them), with every check of their cycles
#  fw-base-*          the same torch IPC and LLM jobs through CRIU's upstream
#                     cuda_plugin (no interposer), the baseline
#
#  fw-llm-native      fw-llm with CUINTERPOSE_PRIVATE=native: its private
#                     memory left to native checkpoint, not carried (FW_ONLY
#                     key llm-native; not in the default set)
# CUINTERPOSE_PRIVATE (carrier, the default, or native) in run.sh's
# environment reaches every job of ours. The LLM job both ways against
# upstream, in one run:
#   FW_ONLY=llm,llm-native,base bundle/scripts/run.sh --only fw --budget 1200
# Each cycle of ours checks: every rank's answers to `verify` (pointers, exact
# checksums of shared and private memory, the cuBLAS product, the graph's
# tensor) equal the ones before the dump; a write by the last rank is seen by
# every rank; a graph captured before the checkpoint replays; a tensor shared
# after the restore arrives intact; the allocator still allocates and frees.
FW_PY=${FW_PY:-python3}
FW_CACHE_MIB=${FW_CACHE_MIB:-2048}
FW_ARRAYS=${FW_ARRAYS:-2000}
FW_BASE=${FW_BASE:-torch-ipc llm} # the jobs run through upstream cuda_plugin under "base"
FW_ONLY=${FW_ONLY:-torch-ipc,torch-exp,torch-async,llm,cupy-ipc,cupy-small,torch-ipc-precopy,llm-precopy,base}
fw_want() { case ",$FW_ONLY," in *,"$1",*) return 0 ;; esac; return 1; }

# start_fw NAME KIND NPROCS PRELOAD(0|1) [ENV=VAL...] [-- FWJOB-ARGS]
start_fw() {
	local name=$1 kind=$2 n=$3 pre=$4 i envs=() launcher=()
	shift 4
	while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
	[ "${1:-}" = -- ] && shift
	NP=$n
	JOBDIR=$T/$name/w
	mkdir -p "$JOBDIR"
	SEQ=0
	[ "$pre" = 1 ] && launcher=("$BUNDLE/bin/cuinterpose" run --lib "$INTERPOSER" --)
	# Python gets only the bundle's libraries that the interposer and the
	# CLI need, not the whole Debian set criu travels with.
	if [ ! -d "$T/pylib" ]; then
		mkdir -p "$T/pylib"
		ldd "$INTERPOSER" "$BUNDLE/bin/cuinterpose" 2>/dev/null | awk -v b="$BUNDLE/lib/" 'index($3, b) == 1 {print $3}' |
			sort -u | xargs -r ln -sf -t "$T/pylib"
	fi
	setsid env LD_LIBRARY_PATH="$T/pylib" PYTHONUNBUFFERED=1 "${envs[@]}" "${R[@]}" "${launcher[@]}" "$FW_PY" "$S/frameworks/fwjob.py" \
		"$kind" "$JOBDIR" "$n" "$@" </dev/null >"$T/$name/job.log" 2>&1 &
	JOBSH=$!
	for ((i = 0; i < ${READY_TIMEOUT:-300} * 20; i++)); do
		[ "$(ls "$JOBDIR"/r*.ready 2>/dev/null | wc -l)" -ge "$n" ] && break
		if ls "$JOBDIR"/*.failed >/dev/null 2>&1; then
			echo "job failed to start: $(cat "$JOBDIR"/*.failed)"
			return 1
		fi
		kill -0 $JOBSH 2>/dev/null || { echo "job exited: $(tail -n 3 "$T/$name/job.log" | tr '\n' ' ')"; return 1; }
		sleep 0.05
	done
	[ "$(ls "$JOBDIR"/r*.ready 2>/dev/null | wc -l)" -ge "$n" ] || { echo "job not ready"; return 1; }
	JOBPID=$(awk '{print $2}' "$JOBDIR/r0.ready")
	echo "job $name ready: $(cat "$JOBDIR"/r*.ready | tr '\n' ';')"
}

# The field after WORD in every rank's last answer, one line per rank.
field() { answers | awk -v w="$1" '{for (i = 1; i < NF; i++) if ($i == w) print $(i + 1)}'; }
# Every process of the job's tree (the resource tracker included).
tree_pids() { ps -e -o pid=,sid= | awk -v s="$JOBSH" '$2 == s {print $1}'; }

# sc_fw NAME KIND NPROCS CYCLES [ENV=VAL...] [-- ARGS]: ours, full checks
sc_fw() {
	local name=$1 kind=$2 n=$3 cycles=$4 c before tokens pids last t0
	shift 4
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	start_fw "$name" "$kind" "$n" 1 "$@" || fail "start: $(tail -n 2 "$T/$name/job.log" | tr '\n' ' ')"
	echo "tree: $(tree_pids | tr '\n' ' ')"
	cmd 120 verify || fail "verify before: $CMDERR"
	before=$(answers)
	cmd 300 gen || fail "gen before: $CMDERR"
	tokens=$(answers)
	last=$((n - 1))
	: >"$T/$name/times"
	for ((c = 1; c <= cycles; c++)); do
		pids=$(tree_pids)
		local parent= pre=
		if [ -n "${FW_PRECOPY:-}" ]; then
			# a live pre-copy while the job runs, then the dump against it
			parent=$T/$name/p$c
			local t0=$(date +%s.%N)
			"$BUNDLE/bin/cuinterpose" precopy --timeout 300 "$JOBPID" "$parent" >"$T/$name/precopy.$c" 2>&1 ||
				fail "cuinterpose precopy (cycle $c): $(tail -n 3 "$T/$name/precopy.$c" | tr '\n' ' ')"
			pre=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.3f", $1 - $2}')
			sed 's/^/  /' "$T/$name/precopy.$c"
			cmd 300 gen || fail "gen between the pre-copy and the dump (cycle $c): $CMDERR"
			[ "$(answers)" = "$tokens" ] || fail "generation differs after the pre-copy (cycle $c)"
		fi
		CUINTERPOSE_PARENT=$parent criu_do dump "$T/$name/d$c" "$T/plugins" --link-remap ||
			fail "criu dump (cycle $c) failed: $(grep -E 'Error|cuinterpose:.*(refus|fail|not)' "$T/$name/d$c/dump.log" | tail -n 3 | tr '\n' ' ')"
		local ds=$SECS
		[ -n "$parent" ] && grep -h "left to the parent" "$T/$name/d$c/dump.log" | sed "s/^.*cuinterpose: /  pre-copy ${pre}s, then /"
		wait_gone $pids || fail "dumped processes still alive (cycle $c)"
		criu_do restore "$T/$name/d$c" "$T/plugins" ||
			fail "criu restore (cycle $c) failed: $(grep -E 'Error|cuinterpose:.*(refus|fail)' "$T/$name/d$c/restore.log" | tail -n 3 | tr '\n' ' ')"
		echo "$ds $SECS $(du -sm "$T/$name/d$c" | cut -f1) ${pre:-}" >>"$T/$name/times"
		grep -h "cuinterpose: " "$T/$name/d$c"/*.log | grep -E "done|SAVE:|LOAD:|dump of tree" | sed 's/^.*cuinterpose: /  /'
		drop_images "$T/$name/d$c"
		[ -n "$parent" ] && drop_images "$parent"
		cmd 300 verify || fail "after restore (cycle $c): $CMDERR"
		[ "$(answers)" = "$before" ] || fail "answers changed (cycle $c): $(answers | tr '\n' ' ') vs $(echo $before)"
		cmd 300 gen || fail "gen after restore (cycle $c): $CMDERR"
		[ "$(answers)" = "$tokens" ] || fail "generation differs after restore (cycle $c): $(answers) vs $tokens"
		if [ "$n" -gt 1 ]; then
			cmd 60 add "$last" $((10 + c)) || fail "write by rank $last (cycle $c): $CMDERR"
			cmd 300 verify || fail "verify after the write (cycle $c): $CMDERR"
			[ "$(field shared | sort -u | wc -l)" = 1 ] || fail "rank $last's write not seen by all (cycle $c): $(field shared | tr '\n' ' ')"
			[ "$(field shared | head -n 1)" != "$(echo "$before" | awk '{print $5; exit}')" ] || fail "the write changed nothing (cycle $c)"
			before=$(answers)
		fi
		cmd 60 graph || fail "graph replay after restore (cycle $c): $CMDERR"
		cmd 120 fresh || fail "fresh share after restore (cycle $c): $CMDERR"
		cmd 120 churn || fail "allocator after restore (cycle $c): $CMDERR"
		cmd 300 verify || fail "verify after graph/fresh/churn (cycle $c): $CMDERR"
		before=$(answers)
	done
	cmd 30 exit
	kill -9 $(tree_pids) 2>/dev/null
	echo "ok: $kind, $n processes, $cycles cycle(s)${FW_PRECOPY:+, each dump against a live pre-copy}; $([ -n "${FW_PRECOPY:-}" ] && echo "pre-copy/dump/restore" || echo "dump/restore") s: $(awk '{printf "%s%s/%s ", ($4 != "" ? $4 "/" : ""), $1, $2}' "$T/$name/times")" >"$T/why"
	kill_job
}

# sc_fwbase NAME KIND NPROCS [ENV=VAL...] [-- ARGS]: through upstream cuda_plugin;
# exit 0 if the job survived with every check, 2 if it did not (the reason in why)
sc_fwbase() {
	local name=$1 kind=$2 n=$3 before tokens pids rcd rcr=skipped
	shift 3
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	start_fw "$name" "$kind" "$n" 0 "$@" || fail "start: $(tail -n 2 "$T/$name/job.log" | tr '\n' ' ')"
	cmd 120 verify || fail "verify before: $CMDERR"
	before=$(answers)
	cmd 300 gen || fail "gen before: $CMDERR"
	tokens=$(answers)
	pids=$(tree_pids)
	criu_do dump "$T/$name/d" "$T/base-plugins" --link-remap
	rcd=$?
	local ds=$SECS
	wait_gone $pids
	[ $rcd = 0 ] && { criu_do restore "$T/$name/d" "$T/base-plugins"; rcr=$?; }
	echo "$ds $SECS" >"$T/$name/times"
	drop_images "$T/$name/d"
	if [ $rcd = 0 ] && [ "$rcr" = 0 ] && cmd 60 verify && [ "$(answers)" = "$before" ] && cmd 120 gen &&
		[ "$(answers)" = "$tokens" ]; then
		echo "survived: dump ${ds}s restore ${SECS}s" >"$T/why"
		kill -9 $(tree_pids) 2>/dev/null
		kill_job
		exit 0
	fi
	echo "criu dump rc=$rcd, criu restore rc=$rcr; after restore: ${CMDERR:-answers differ}" >"$T/why"
	kill -9 $(tree_pids) 2>/dev/null
	kill_job
	exit 2
}

# fw_one KEY NAME KIND NPROCS CYCLES [ENV...] [-- ARGS]: one of ours, if wanted
fw_one() {
	local key=$1 name=$2
	shift 2
	fw_want "$key" || return 0
	scenario "$name" fw "$name" "$@"
	[ $SC_RC = 0 ] && result "$name" PASS "$SC_WHY" || result "$name" FAIL "$SC_WHY"
}

run_fw() {
	local s
	fw_one torch-ipc fw-torch-ipc torch-ipc 3 2
	fw_one torch-exp fw-torch-exp torch-ipc 3 2 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
	fw_one torch-async fw-torch-async torch-async 1 2 PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
	fw_one llm fw-llm llm 1 2 -- --cache-mib "$FW_CACHE_MIB"
	fw_one llm-native fw-llm-native llm 1 2 CUINTERPOSE_PRIVATE=native -- --cache-mib "$FW_CACHE_MIB"
	fw_one cupy-ipc fw-cupy-ipc cupy-ipc 3 2
	FW_PRECOPY=1 fw_one torch-ipc-precopy fw-torch-ipc-precopy torch-ipc 3 2
	FW_PRECOPY=1 fw_one llm-precopy fw-llm-precopy llm 1 2 -- --cache-mib "$FW_CACHE_MIB"
	fw_want cupy-small && run_fw_small
	if fw_want base && [ -f "$BASE_PLUGIN" ]; then
		for s in $FW_BASE; do
			local extra=()
			[ $s = llm ] && extra=(-- --cache-mib "$FW_CACHE_MIB")
			scenario "fw-base-$s" fwbase "fw-base-$s" "$s" "$([ $s = llm ] && echo 1 || echo 3)" "${extra[@]}"
			case $SC_RC in
			0) result "fw-base-$s" DONE "upstream cuda_plugin: $SC_WHY" ;;
			2) result "fw-base-$s" BASE-FAILS "upstream cuda_plugin: $SC_WHY" ;;
			*) result "fw-base-$s" FAIL "harness: $SC_WHY" ;;
			esac
		done
		fw_ratio llm
		fw_ratio llm-native llm
	fi
}

# The device memory of FW_ARRAYS small CuPy arrays with and without the
# interposer (target: within 1.1x), then two cycles of the interposed job.
run_fw_small() {
	local native ours
	scenario fw-cupy-small-native fwready fw-cupy-small-native 0 -- --arrays "$FW_ARRAYS"
	native=$(awk '{for (i = 1; i < NF; i++) if ($i == "used_mib") print $(i + 1)}' "$T/fw-cupy-small-native/w/r0.ready" 2>/dev/null)
	scenario fw-cupy-small fw fw-cupy-small cupy-small 1 2 -- --arrays "$FW_ARRAYS"
	ours=$(awk '{for (i = 1; i < NF; i++) if ($i == "used_mib") print $(i + 1)}' "$T/fw-cupy-small/w/r0.ready" 2>/dev/null)
	[ $SC_RC = 0 ] && result fw-cupy-small PASS "$SC_WHY" || result fw-cupy-small FAIL "$SC_WHY"
	if [ -n "$native" ] && [ -n "$ours" ]; then
		result fw-cupy-small-mem "$(awk -v a="$native" -v b="$ours" 'BEGIN {print (b <= 1.1 * a + 2) ? "MET" : "MISSED"}')" \
			"$FW_ARRAYS x 4 KiB CuPy arrays: $native MiB without the interposer, $ours MiB with it (target <= 1.1x)"
	else
		result fw-cupy-small-mem FAIL "no numbers (native '$native', ours '$ours')"
	fi
}

# sc_fwready NAME PRELOAD -- ARGS: start cupy-small, keep its ready line, exit
sc_fwready() {
	local name=$1 pre=$2
	shift 2
	start_fw "$name" cupy-small 1 "$pre" "$@" || { echo "start failed" >"$T/why"; exit 1; }
	cmd 30 exit
	kill_job
}

# fw_ratio KEY [BASEKEY]: ours against upstream on the same job (upstream's
# run of BASEKEY, default KEY): total dump + restore of cycle 1
fw_ratio() {
	local a b
	a=$(awk 'NR == 1 {print $1 + $2}' "$T/fw-$1/times" 2>/dev/null)
	b=$(awk 'NR == 1 {print $1 + $2}' "$T/fw-base-${2:-$1}/times" 2>/dev/null)
	[ -n "$a" ] && [ -n "$b" ] || return 0
	result "fw-$1-ratio" DONE "$(awk -v a="$a" -v b="$b" 'BEGIN {printf "dump+restore %.2fs ours, %.2fs upstream cuda_plugin: ratio %.2f", a, b, a / b}')"
}
