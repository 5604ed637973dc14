# bench.sh - issue 17's benchmark parts of the GPU suite, sourced by run.sh
# (whose helpers start_job, start_fw, cmd, answers, criu_do, wait_gone,
# scenario, result, tree_pids it uses). Each part runs alone and fits in one
# call of 600 s at the sizes below; every part prints its elapsed time.
#
#   run.sh --only bench-llm      the LLM-style job (fwjob.py llm: a GPT-2-shaped
#                                fp16 model + BENCH_LLM_GIB of cache), ours
#                                (interposer preloaded, every tracked
#                                allocation through the striped carrier) then
#                                upstream cuda_plugin, one dump+restore each;
#                                sizes BENCH_LLM_GIB (default "2 8 32")
#   run.sh --only bench-share    gpu_job, 4 processes sharing BENCH_SHARE_GIB
#                                (default 4) through ours, against the same
#                                bytes held privately by rank 0 through
#                                upstream cuda_plugin (--private-only)
#   run.sh --only bench-incr     incremental checkpoints (CUINTERPOSE_PARENT) of
#                                the LLM job at BENCH_INCR_GIB (default 8): a full
#                                dump, two generations, a dump against it, two
#                                more, a live `cuinterpose precopy`, one more,
#                                the final dump against the pre-copy, then a
#                                cold restore through the chain; every dump
#                                counted until durable (sync). Bytes each
#                                stores against the first, the second's
#                                durable time against upstream's cold dump of
#                                the same job and the final dump's (the job
#                                frozen) against our plain cold dump, when
#                                bench-llm ran at that size in the same call
#                                (targets: <= 5%, <= 0.2x)
#   run.sh --only bench-carrier  carrier-bench -x: the carrier into one file
#                                and striped over BENCH_CARRIER_FILES (16)
#                                files against the best plain parallel write
#                                and read, BENCH_CARRIER_GIB (8) in the image
#                                directory's file system
#
# BENCH_KINDS="ours base" (default) picks the sides; ratio rows need both in
# one run. "pf" (bench-llm) is ours with the restore's read-ahead
# (CUINTERPOSE_PREFETCH_MB=auto). "zs" (bench-llm) is ours with compressed
# carrier chunks (CUINTERPOSE_CARRIER_COMPRESS=zstd in the job's
# environment); its rows put images, dump and restore, warm and cold,
# against ours without. "rel" (bench-llm) is ours with CUINTERPOSE_RELEASE=torch (the
# caching allocator emptied before each dump): its rows put the carried
# bytes against torch.cuda.memory_allocated() (target <= 1.2x) and its cold
# restore against upstream's (target <= 0.35x). BENCH_LLM_FREED=1: the job
# holds 256 MiB of cache and has computed and freed a temporary of the size
# instead (torch keeps it reserved), as the storage issue measured. BENCH_CACHE="warm cold" (default; bench-llm) runs one cycle per
# word on the same job: warm as before (criu's own time, the images still in
# the page cache), cold as a node after a reboot has them (the dump counts
# until `sync` returns, the restore starts from a dropped page cache), each
# against upstream in the same mode, and cold against the plain parallel
# cold read of the images' bytes (PLAINIO_COLD, BENCH_IO_THREADS_COLD,
# default 16) as the ceiling. "capped" is cold with the restore run in a
# memory cgroup (v2 or v1) limited to BENCH_CAP_MIB (4096): criu, the restored
# job and the page cache of their reads must fit, so images larger than
# that are larger than the memory the restore may use (as in a container
# with a memory limit); criu restores with --manage-cgroups=ignore so the
# job stays inside. "vf" (bench-llm) is ours verifying every carrier before
# LOAD (CUINTERPOSE_TEST_LOAD_VERIFY=first: each byte read twice); its capped
# row goes beside ours and upstream's. For every dump and restore: seconds, the peak extra RSS of EVERY
# process of the job (rss.sh: VmHWM after clear_refs over the RSS before the
# dump; restore against the same process's RSS before the dump), and for
# ours the carrier's SAVE/LOAD GB/s from the plugin's log lines, against the
# best plain parallel write/read (plainio.py, 1..16 threads on as many
# files) of the same byte count into the same image directory right after.
# Targets: LLM dump+restore <= 0.4x upstream at 8 and 32 GiB; sharing job
# <= 0.25x upstream-private; extra RSS <= 256 MiB per process; carrier save
# and load >= 0.8x the best plain parallel write/read.
#
# Disk and memory: images of ours and upstream never coexist (each run's
# images are deleted before the next starts, plainio's files after each
# thread count); before each run the image directory's free space must hold
# the images plus 4 GiB, and for upstream MemAvailable must hold the device
# bytes twice (native checkpoint copies them into the process, CRIU's page
# dump reads them again), else that run is a SKIP row with the reason.
# BENCH_DIR (default the suite's work directory) is where images go.
. "$S/rss.sh"

BENCH_LLM_GIB=${BENCH_LLM_GIB:-2 8 32}
BENCH_SHARE_GIB=${BENCH_SHARE_GIB:-4}
BENCH_KINDS=${BENCH_KINDS:-ours base}
BENCH_CAP_MIB=${BENCH_CAP_MIB:-4096}
BENCH_IO_THREADS=${BENCH_IO_THREADS:-1 4 8 16}
# the samples as time series too (NAME/rss-d/PID.series.txt, in logs.tar.gz)
export RSS_SERIES=${RSS_SERIES:-1}

bench_kind() { case " $BENCH_KINDS " in *" $1 "*) return 0 ;; esac; return 1; }
bench_dir() { echo "${BENCH_DIR:-$T}/$1/img"; }
part_start() { PART_T0=$(date +%s.%N); say "=== $1"; }
part_end() { say "=== $1 done in $(echo "$(date +%s.%N) $PART_T0" | awk '{printf "%.0f", $1 - $2}')s"; }

# room MIB_IMAGES MIB_RAM: why a run cannot go, or nothing
room() {
	local avail ram
	mkdir -p "${BENCH_DIR:-$T}"
	avail=$(df -Pm "${BENCH_DIR:-$T}" | awk 'NR == 2 {print $4}')
	ram=$(awk '$1 == "MemAvailable:" {printf "%d", $2 / 1024}' /proc/meminfo)
	if [ "$avail" -lt $(($1 + 4096)) ]; then
		echo "needs $(($1 + 4096)) MiB free for images in ${BENCH_DIR:-$T}, $avail MiB free"
	elif [ "$ram" -lt "$2" ]; then
		echo "needs $2 MiB of available memory, $ram MiB available"
	fi
}

# carrier_rate LOG SAVE|LOAD: the plugin's MB/s for that phase, in GB/s
carrier_rate() {
	grep -h "cuinterpose: $2: " "$1" 2>/dev/null | sed -n 's/.*, \([0-9.]*\) MB\/s.*/\1/p' | tail -n 1 |
		awk '{printf "%.2f", $1 / 1000}'
}

# plain_io DIR BYTES: "WRITE_GBS READ_GBS" best of BENCH_IO_THREADS, into DIR
plain_io() {
	local out
	out=$(timeout 900 python3 "$S/plainio.py" "$1" "$2" $BENCH_IO_THREADS 2>&1) || echo "plainio.py failed or ran over 900 s: $out" >&2
	echo "$out" | sed 's/^/  /' >&2
	echo "$out" | awk '/^best write/ {print $3, $8}'
}

# measured NAME KIND DIR: the row of one dump+restore into $T/NAME/bench
# (bench-cold for a cold cycle):
# "dump_s restore_s rss_dump_max rss_restore_max images_mib save_gbs load_gbs sync_s held_s frozen_s"
# after it printed every process's extra RSS. held_s and frozen_s: the
# job's pause, from our plugin's "pause:" line; upstream's cuda_plugin
# prints none, and its job is frozen and its CUDA calls locked for the
# whole dump: both are then the dump's seconds.
measured() {
	local name=$1 kind=$2 d=$3
	echo "  extra RSS per process, MiB (pid value): dump $(rss_extra "$T/$name/rss-d" | tr '\n' ' ')restore $(rss_extra "$T/$name/rss-r" | tr '\n' ' ')"
	echo "$DS $RS $(rss_max "$T/$name/rss-d") $(rss_max "$T/$name/rss-r") $IMG \
$(carrier_rate "$d/dump.log" SAVE) $(carrier_rate "$d/restore.log" LOAD) ${SYNC_S:-0} $(pause_of "$d/dump.log" "$DS")" >"$T/$name/bench$([ "${CACHE:-warm}" != warm ] && echo "-$CACHE")"
}

# pause_of DUMPLOG DUMP_S: "held_s frozen_s" from the plugin's pause line,
# else the dump's seconds twice (a dump that freezes the job throughout)
pause_of() {
	local l
	l=$(grep -o 'pause: CUDA calls held [0-9.]* s, threads frozen [0-9.]* s' "$1" 2>/dev/null | tail -n 1)
	if [ -n "$l" ]; then echo "$l" | awk '{print $5, $9}'; else echo "$2 $2"; fi
}

# sync, bounded: storage that stops accepting writes is named, not waited on
bounded_sync() { timeout 600 sync || { echo "sync did not return within 600 s (storage hung?)" >&2; return 1; }; }
# drop_caches: what a node has after a reboot (root)
drop_caches() { bounded_sync && echo 3 >/proc/sys/vm/drop_caches; }

# cap_enter: this shell (so the criu it starts and what criu restores) into
# a memory cgroup limited to BENCH_CAP_MIB (cgroup v2 memory.max, or v1
# memory.limit_in_bytes); cap_leave lifts the limit and takes the shell
# back (the restored job stays there, unlimited). A cgroup of its own per
# scenario (its peak and kill counts are this restore's); empty ones of
# earlier scenarios are removed.
cap_enter() {
	if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
		rmdir /sys/fs/cgroup/cuip-bench-cap.* 2>/dev/null
		CGV=2 CG=/sys/fs/cgroup/cuip-bench-cap.$BASHPID CG_FROM=/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
		grep -qw memory /sys/fs/cgroup/cgroup.subtree_control ||
			echo +memory >/sys/fs/cgroup/cgroup.subtree_control || return 1
		mkdir -p "$CG" && echo $((BENCH_CAP_MIB << 20)) >"$CG/memory.max" || return 1
		echo 0 >"$CG/memory.swap.max" 2>/dev/null
	elif [ -d /sys/fs/cgroup/memory ]; then
		rmdir /sys/fs/cgroup/memory/cuip-bench-cap.* 2>/dev/null
		CGV=1 CG=/sys/fs/cgroup/memory/cuip-bench-cap.$BASHPID
		CG_FROM=/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
		mkdir -p "$CG" && echo $((BENCH_CAP_MIB << 20)) >"$CG/memory.limit_in_bytes" || return 1
		echo 0 >"$CG/memory.max_usage_in_bytes"
	else
		echo "no memory cgroup (v2 or v1) under /sys/fs/cgroup"
		return 1
	fi
	echo "$BASHPID" >"$CG/cgroup.procs"
}
cap_leave() {
	local peak oom
	if [ "$CGV" = 2 ]; then
		echo max >"$CG/memory.max"
		peak=$(cat "$CG/memory.peak" 2>/dev/null) oom=$(awk '$1 == "oom_kill" {print $2}' "$CG/memory.events")
	else
		echo -1 >"$CG/memory.limit_in_bytes"
		peak=$(cat "$CG/memory.max_usage_in_bytes") oom=$(awk '$1 == "oom_kill" {print $2}' "$CG/memory.oom_control")
	fi
	echo "$BASHPID" >"$CG_FROM/cgroup.procs"
	echo "capped restore: the cgroup's peak $((${peak:-0} >> 20)) MiB of $BENCH_CAP_MIB, ${oom:-?} process(es) killed for memory"
}

# dump_restore NAME KIND DIR PLUGINDIR "PIDS" [DUMP ARGS]: one dump and one
# restore with every process's RSS sampled; the images are dropped and the
# row written by measured(). Runs inside a scenario (fail exits it).
dump_restore() {
	local name=$1 kind=$2 d=$3 pl=$4 pids=$5
	shift 5
	rss_start "$T/$name/rss-d" $pids
	CRIU_TIMEOUT=550 criu_do dump "$d" "$pl" "$@" ||
		fail "criu dump failed: $(grep -E 'Error|cuinterpose:.*(refus|fail)|cuda_plugin.*fail' "$d/dump.log" | tail -n 2 | tr '\n' ' ')"
	DS=$SECS
	SYNC_S=0
	if [ "${CACHE:-warm}" != warm ]; then
		# durable: the dump is over when its bytes are on the disk
		local t0=$(date +%s.%N)
		bounded_sync || fail "sync after the dump did not return within 600 s"
		SYNC_S=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.3f", $1 - $2}')
		echo "sync after the dump: ${SYNC_S}s"
	fi
	wait_gone $pids || fail "dumped processes still alive"
	rss_stop "$T/$name/rss-d"
	IMG=$(du -sm "$d" | cut -f1)
	echo "images: $IMG MiB stored, $(du -sm --apparent-size "$d" | cut -f1) MiB apparent (the difference: holes)"
	[ "${CACHE:-warm}" != warm ] && { drop_caches || fail "cannot drop the page cache (not root?)"; }
	rss_start "$T/$name/rss-r" "$T/$name/rss-d" $pids
	local rc
	if [ "${CACHE:-warm}" = capped ]; then
		cap_enter || fail "cannot set up the capped cgroup $CG"
		CRIU_TIMEOUT=240 criu_do restore "$d" "$pl" --manage-cgroups=ignore
		rc=$?
		cap_leave
	else
		CRIU_TIMEOUT=550 criu_do restore "$d" "$pl"
		rc=$?
	fi
	[ $rc = 0 ] ||
		fail "criu restore failed: $(grep -E 'Error|cuinterpose:.*(refus|fail)|cuda_plugin.*fail' "$d/restore.log" | tail -n 2 | tr '\n' ' ')"
	RS=$SECS
	sleep 0.5
	rss_stop "$T/$name/rss-r"
	grep -h "cuinterpose: \(SAVE\|LOAD\): " "$d"/*.log | sed 's/^.*cuinterpose: /  /'
	drop_images "$d"
	measured "$name" "$kind" "$d"
}

# sc_bench_llm NAME KIND(ours|base) GIB: one dump+restore of the LLM job
# per BENCH_CACHE word, the job answering the same after each
sc_bench_llm() {
	local name=$1 kind=$2 gib=$3 mib pre pl before tokens why d
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	mib=$((gib * 1024))
	d=$(bench_dir "$name")
	[ "$kind" = base ] && pre=0 pl=$T/base-plugins || pre=1 pl=$T/plugins
	why=$(room $((mib + 1024)) $([ "$kind" = base ] && echo $((mib * 2 + 4096)) || echo 4096))
	[ -n "$why" ] && { echo "$why" >"$T/why"; exit 4; }
	# "pf": ours with the restore's read-ahead (plugin/prefetch.h)
	[ "$kind" = pf ] && export CUINTERPOSE_PREFETCH_MB=auto
	READY_TIMEOUT=600 start_fw "$name" llm 1 "$pre" $([ "$kind" = rel ] && echo CUINTERPOSE_RELEASE=torch) \
		$([ "$kind" = zs ] && echo CUINTERPOSE_CARRIER_COMPRESS=zstd CUINTERPOSE_LOG=2) \
		$([ "$kind" = vf ] && echo CUINTERPOSE_TEST_LOAD_VERIFY=first) \
		-- $([ -n "${BENCH_LLM_FREED:-}" ] && echo --cache-mib 256 --temp-mib || echo --cache-mib) "$mib" ||
		fail "start: $(tail -n 2 "$T/$name/job.log" | tr '\n' ' ')"
	cmd 300 verify || fail "verify before: $CMDERR"
	before=$(answers)
	cmd 300 gen || fail "gen before: $CMDERR"
	tokens=$(answers)
	for CACHE in ${BENCH_CACHE:-warm cold}; do
		say "--- $name: $CACHE cycle"
		cmd 300 mem || fail "mem before the $CACHE dump: $CMDERR"
		answers >"$T/$name/mem-$CACHE"
		dump_restore "$name" "$kind" "$d" "$pl" "$(tree_pids)" --link-remap
		# "SAVE: 1 participants, N records, BYTES bytes, ..." (ours only)
		grep -ho "SAVE: [0-9]* participants, [0-9]* records, [0-9]* bytes" "$d/dump.log" |
			awk '{print $6}' >"$T/$name/carried-$CACHE"
		cmd 300 verify || fail "after the $CACHE restore: $CMDERR"
		[ "$(answers)" = "$before" ] || fail "answers changed: $(answers | tr '\n' ' ') vs $(echo $before)"
		cmd 300 gen || fail "gen after the $CACHE restore: $CMDERR"
		[ "$(answers)" = "$tokens" ] || fail "generation differs after the $CACHE restore"
	done
	cmd 30 exit
	kill -9 $(tree_pids) 2>/dev/null
	kill_job
	if [ "$kind" = ours ]; then
		# the baseline: the same bytes, plain, into the same directory
		echo "$(plain_io "$d" $((mib << 20)))" >"$T/$name/plain"
		case " ${BENCH_CACHE:-warm cold} " in *" cold "*)
			echo "$(PLAINIO_COLD=1 BENCH_IO_THREADS=${BENCH_IO_THREADS_COLD:-16} plain_io "$d" $((mib << 20)))" \
				>"$T/$name/plain-cold"
			;;
		esac
	fi
	echo "ok" >"$T/why"
}

# sc_bench_share NAME KIND(ours|base) GIB: 4 processes sharing GIB (ours), or
# rank 0 holding it privately (upstream cuda_plugin)
sc_bench_share() {
	local name=$1 kind=$2 gib=$3 mib pre pl args why d
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	mib=$((gib * 1024))
	d=$(bench_dir "$name")
	if [ "$kind" = ours ]; then
		pre=1 pl=$T/plugins args=(--shared-mib "$mib" --private-mib 16 --no-graph)
	else
		pre=0 pl=$T/base-plugins args=(--private-only --shared-mib "$mib" --private-mib 16 --no-graph)
	fi
	why=$(room $((mib + 1024)) $([ "$kind" = base ] && echo $((mib * 2 + 4096)) || echo 4096))
	[ -n "$why" ] && { echo "$why" >"$T/why"; exit 4; }
	READY_TIMEOUT=600 start_job "$name" 4 $pre "${args[@]}" || fail "start: $(tail -n 1 "$T/$name/job.log")"
	cmd 300 verify || fail "verify before: $CMDERR"
	dump_restore "$name" "$kind" "$d" "$pl" "$(job_pids)"
	cmd 600 verify || fail "bytes after restore: $CMDERR"
	cmd 30 exit
	kill_job
	[ "$kind" = ours ] && echo "$(plain_io "$d" $((mib << 20)))" >"$T/$name/plain"
	echo ok >"$T/why"
}

# bench_rows PREFIX NAME_OURS NAME_BASE TARGET: result rows of one size, per
# cache mode that ran (warm rows keep their old names; cold ones end -cold)
bench_rows() {
	local p=$1 target=$4 k f m sfx o b
	for m in warm cold; do
		sfx=$([ $m = cold ] && echo -cold)
		o=$T/$2/bench$sfx b=$T/$3/bench$sfx
		for k in ours base; do
			f=$([ $k = ours ] && echo "$o" || echo "$b")
			[ -f "$f" ] || continue
			result "$p-$k$sfx" DONE "$(awk '{printf "dump %.2fs%s restore %.2fs total %.2fs; pause: CUDA calls held %.2fs, threads frozen %.2fs; peak extra RSS of the processes dump %s MiB restore %s MiB; images %s MiB", $1, ($8 > 0 ? sprintf(" + sync %.2fs", $8) : ""), $2, $1 + $8 + $2, $9, $10, $3, $4, $5}' "$f"); per process (pid MiB) dump: $(rss_extra "$(dirname "$f")/rss-d" | tr '\n' ',') restore: $(rss_extra "$(dirname "$f")/rss-r" | tr '\n' ',')"
			[ $m = warm ] && result "$p-$k-rss" "$(awk '{print ($3 <= 256 && $4 <= 256) ? "MET" : "MISSED"}' "$f")" \
				"$(awk '{printf "largest extra RSS of any process: dump %s MiB, restore %s MiB (target <= 256)", $3, $4}' "$f")"
		done
		if [ -f "$o" ] && [ -f "$b" ]; then
			result "$p-ratio$sfx" "$(awk -v t="$target" 'NR == FNR {a = $1 + $8 + $2; next} {print (a / ($1 + $8 + $2) <= t) ? "MET" : "MISSED"}' "$o" "$b")" \
				"$(awk -v t="$target" -v m=$m 'NR == FNR {d = $1 + $8; r = $2; next} {printf "%s: ours %.2fs / upstream %.2fs = %.2f (target <= %s); dump%s %.2fs / %.2fs = %.2f, restore %.2fs / %.2fs = %.2f", m, d + r, $1 + $8 + $2, (d + r) / ($1 + $8 + $2), t, m == "cold" ? " until durable" : "", d, $1 + $8, d / ($1 + $8), r, $2, r / $2}' "$o" "$b")"
		fi
	done
	o=$T/$2/bench
	if [ -f "$o" ] && [ -s "$T/$2/plain" ]; then
		result "$p-carrier-io" "$(awk 'NR == FNR {s = $6; l = $7; next} {print (s >= 0.8 * $1 && l >= 0.8 * $2) ? "MET" : "MISSED"}' "$o" "$T/$2/plain")" \
			"$(awk 'NR == FNR {s = $6; l = $7; next} {printf "carrier SAVE %s GB/s = %.2f of the best plain parallel write %s GB/s; LOAD %s GB/s = %.2f of the best plain parallel read %s GB/s (same directory, same run; target >= 0.8)", s, s / $1, $1, l, l / $2, $2}' "$o" "$T/$2/plain")"
	fi
	# cold: the restore against the plain parallel cold read of what the
	# images hold (du: holes are not read), target 1.1x
	o=$T/$2/bench-cold
	if [ -f "$o" ] && [ -s "$T/$2/plain-cold" ]; then
		result "$p-cold-read" "$(awk 'NR == FNR {r = $2; mib = $5; next} {print (r <= 1.1 * mib * 1048576 / ($2 * 1e9)) ? "MET" : "MISSED"}' "$o" "$T/$2/plain-cold")" \
			"$(awk 'NR == FNR {r = $2; mib = $5; l = $7; next} {c = mib * 1048576 / ($2 * 1e9); printf "cold restore %.2fs = %.2fx the plain parallel cold read of its %s MiB of images (%.2fs at %s GB/s; target <= 1.1); its LOAD %s GB/s; plain cold write+fsync %s GB/s", r, r / c, mib, c, $2, l, $1}' "$o" "$T/$2/plain-cold")"
	fi
}

# rel_rows PREFIX: the release hooks' rows of one size (bench-llm "rel"):
# carried bytes against torch's allocated bytes, ours with and without the
# release, and the cold cycle against upstream's
rel_rows() {
	local p=$1 m r=$T/$1-rel b=$T/$1-base o=$T/$1-ours
	for m in warm cold; do
		[ -s "$r/carried-$m" ] && [ -s "$r/mem-$m" ] || continue
		result "$p-rel-carried-$m" "$(awk 'NR == FNR {c = $1; next} {print (c <= 1.2 * $3) ? "MET" : "MISSED"}' "$r/carried-$m" "$r/mem-$m")" \
			"$(awk -v without="$(cat "$o/carried-$m" 2>/dev/null)" 'NR == FNR {c = $1; next} {printf "CUINTERPOSE_RELEASE=torch: %.2f GB carried for %.2f GB torch.cuda.memory_allocated() (%.2f GB reserved before the release) = %.2fx (target <= 1.2); without the release %s GB", c / 1e9, $3 / 1e9, $5 / 1e9, c / $3, without == "" ? "?" : sprintf("%.2f", without / 1e9)}' "$r/carried-$m" "$r/mem-$m")"
	done
	if [ -f "$r/bench-cold" ] && [ -f "$b/bench-cold" ]; then
		result "$p-rel-ratio-cold" "$(awk 'NR == FNR {a = $1 + $8 + $2; ra = $2; next} {print (ra / $2 <= 0.35) ? "MET" : "MISSED"}' "$r/bench-cold" "$b/bench-cold")" \
			"$(awk 'NR == FNR {d = $1 + $8; ra = $2; next} {printf "cold restore with the release %.2fs / upstream %.2fs = %.2f (target <= 0.35); dump until durable %.2fs / %.2fs = %.2f", ra, $2, ra / $2, d, $1 + $8, d / ($1 + $8)}' "$r/bench-cold" "$b/bench-cold")"
	fi
	if [ -f "$r/bench" ] && [ -f "$b/bench" ]; then
		result "$p-rel-ratio" DONE "$(awk 'NR == FNR {a = $1 + $2; next} {printf "warm: with the release %.2fs / upstream %.2fs = %.2f", a, $1 + $2, a / ($1 + $2)}' "$r/bench" "$b/bench")"
	fi
}

# pf_rows PREFIX: the restore's read-ahead against none, same job, same
# run (bench-llm "pf": ours with CUINTERPOSE_PREFETCH_MB=auto)
pf_rows() {
	local o=$T/$1-ours p=$T/$1-pf
	[ -f "$o/bench-cold" ] && [ -f "$p/bench-cold" ] || return 0
	# the warm files exist only where BENCH_CACHE has "warm"
	result "$1-prefetch" DONE "$(awk 'FILENAME ~ /pf\/bench-cold$/ {r = $2} FILENAME ~ /ours\/bench-cold$/ {nr = $2; mib = $5} FILENAME ~ /pf\/bench$/ {w = $2} FILENAME ~ /ours\/bench$/ {nw = $2} FILENAME ~ /plain-cold$/ {c = mib * 1048576 / ($2 * 1e9)} END {printf "cold restore with the read-ahead %.2fs, without %.2fs (%.2f); against the plain parallel cold read of its %s MiB (%.2fs): %.2fx with, %.2fx without", r, nr, r / nr, mib, c, r / c, nr / c; if (w != "") printf "; warm restore %.2fs with, %.2fs without", w, nw}' "$p/bench-cold" "$o/bench-cold" $(ls "$p/bench" "$o/bench" 2>/dev/null) "$o/plain-cold")"
}

# capped_rows PREFIX: the capped restores (BENCH_CACHE "capped") of each kind
# beside its uncapped cold one; a kind without one failed (see its row)
capped_rows() {
	local p=$1 k f line=
	case " ${BENCH_CACHE:-warm cold} " in *" capped "*) ;; *) return 0 ;; esac
	for k in ours vf base; do
		bench_kind $k || continue
		f=$T/$p-$k/bench-capped
		if [ -f "$f" ]; then
			line="$line$k $(awk 'NR == FNR {r = $2; i = $5; l = $7; next} {c = $2} END {printf "%.2fs (uncapped cold %s; images %s MiB, LOAD %s GB/s)", r, c == "" ? "-" : sprintf("%.2fs", c), i, l}' "$f" $(ls "$T/$p-$k/bench-cold" 2>/dev/null)); "
		else
			line="${line}$k no capped restore (its row says why); "
		fi
	done
	result "$p-capped" DONE "restore in a cgroup of memory.max $BENCH_CAP_MIB MiB: $line"
}

# zs_rows PREFIX: compressed carrier chunks against none, same job, same
# run (bench-llm "zs": ours with CUINTERPOSE_CARRIER_COMPRESS=zstd)
zs_rows() {
	local o=$T/$1-ours z=$T/$1-zs m sfx
	for m in warm cold; do
		sfx=$([ $m = cold ] && echo -cold)
		[ -f "$o/bench$sfx" ] && [ -f "$z/bench$sfx" ] || continue
		result "$1-zstd$sfx" DONE "$(awk -v m=$m 'NR == FNR {d = $1 + $8; r = $2; i = $5; next} {printf "%s: with zstd images %s MiB, dump%s %.2fs, restore %.2fs, total %.2fs; without %s MiB, %.2fs, %.2fs, %.2fs (total %.2f)", m, i, m == "cold" ? " until durable" : "", d, r, d + r, $5, $1 + $8, $2, $1 + $8 + $2, (d + r) / ($1 + $8 + $2)}' "$z/bench$sfx" "$o/bench$sfx")"
	done
	grep -h "stored compressed" "$z"/*.log 2>/dev/null | head -n 2 | sed 's/^.*cuinterpose[^:]*: /  /'
}

# bench_one SCENARIO PREFIX KIND GIB: run it, turn a skip or failure into a row
bench_one() {
	local sc=$1 name=$2-$3 kind=$3 gib=$4
	SC_RC=0
	scenario "$name" "$sc" "$name" "$kind" "$gib"
	case $SC_RC in
	0) ;;
	4) result "$name" SKIP "$SC_WHY" ;;
	*) result "$name" FAIL "$SC_WHY" ;;
	esac
}

# run_bench_sizes PART SCENARIO TARGET GIB...: ours and upstream per size, then the rows
run_bench_sizes() {
	local part=$1 sc=$2 target=$3 g k
	shift 3
	part_start "$part"
	for g in "$@"; do
		for k in ours base rel pf zs vf; do
			bench_kind $k || continue
			if [ $k = base ] && [ ! -f "$BASE_PLUGIN" ]; then
				result "$part-${g}G-base" SKIP "no baseline/cuda_plugin.so in the bundle"
				continue
			fi
			bench_one "$sc" "$part-${g}G" $k "$g"
		done
		bench_rows "$part-${g}G" "$part-${g}G-ours" "$part-${g}G-base" "$target"
		bench_kind rel && rel_rows "$part-${g}G"
		bench_kind pf && pf_rows "$part-${g}G"
		bench_kind zs && zs_rows "$part-${g}G"
		capped_rows "$part-${g}G"
	done
	part_end "$part"
}

run_bench_llm() { run_bench_sizes bench-llm bench_llm 0.4 $BENCH_LLM_GIB; }

# carriers_stored DIR: bytes the carrier files store (holes and inherited
# chunks are not stored)
carriers_stored() { du -B1 -c "$1"/cuinterpose-carrier-*.img 2>/dev/null | tail -n 1 | cut -f1; }
carriers_apparent() { du -B1 -c --apparent-size "$1"/cuinterpose-carrier-*.img 2>/dev/null | tail -n 1 | cut -f1; }

# incr_dump DIR [criu args]: a dump counted until durable; DUMP_S, SYNC_S
incr_dump() {
	local d=$1 t0
	shift
	CRIU_TIMEOUT=550 criu_do dump "$d" "$T/plugins" --link-remap "$@" ||
		fail "criu dump into $d failed: $(grep -E 'Error|cuinterpose:.*(refus|fail)' "$d/dump.log" | tail -n 2 | tr '\n' ' ')"
	DUMP_S=$SECS
	t0=$(date +%s.%N)
	bounded_sync || fail "sync after the dump did not return within 600 s"
	SYNC_S=$(echo "$(date +%s.%N) $t0" | awk '{printf "%.3f", $1 - $2}')
	echo "$d: dump ${DUMP_S}s + sync ${SYNC_S}s; carriers store $(carriers_stored "$d") of $(carriers_apparent "$d") bytes;" \
		"criu's own images $(criu_images "$d") bytes ($(du -B1 -c "$d"/pages-*.img 2>/dev/null | tail -n 1 | cut -f1) of them pages)"
	grep -h "cuinterpose: \(SAVE\|incremental\|PAUSE_DEVICES done\|CHECKPOINT_DEVICES done\|native\|pause:\)" "$d/dump.log" | sed 's/^.*cuinterpose: /  /'
	PAUSE=$(pause_of "$d/dump.log" "$DUMP_S")
	grep -h "Dumping finished\|Freezing tasks into\|Unfreez" "$d/dump.log" | sed 's/^/  criu: /'
}

# phase_s DUMPLOG PHASE: the seconds of the plugin's "PHASE: N participants, ..., S s" line
phase_s() { grep -o "cuinterpose: $2: [0-9]* participants.*" "$1" | head -n 1 | grep -o '[0-9.]* s' | head -n 1 | awk '{print $1 + 0}'; }
# native_s DUMPLOG: seconds of the native checkpoint (the plugin's
# "CHECKPOINT_DEVICES done: N CUDA processes checkpointed, S s"; 0: no line)
native_s() { grep -o 'CHECKPOINT_DEVICES done: .*, [0-9.]* s' "$1" | tail -n 1 | grep -o '[0-9.]* s$' | awk '{print $1 + 0}'; }

# criu_images DIR: bytes of everything in DIR but the carriers and the logs
criu_images() {
	find "$1" -maxdepth 1 -type f ! -name 'cuinterpose-carrier-*' ! -name '*.log' -printf '%s\n' |
		awk '{s += $1} END {print s + 0}'
}

# sc_bench_incr NAME GIB: the LLM job through a chain of three dumps, each
# against the one before, and a cold restore from the last
sc_bench_incr() {
	local name=$1 gib=$3 mib d before tokens g out t0
	fail() { echo "$*" >"$T/why"; echo "FAIL: $*"; exit 1; }
	mib=$((gib * 1024))
	d=$(bench_dir "$name")
	why=$(room $((mib * 2 + 2048)) 4096)
	[ -n "$why" ] && { echo "$why" >"$T/why"; exit 4; }
	rm -rf "$d" && mkdir -p "$d"
	READY_TIMEOUT=600 start_fw "$name" llm 1 1 CUINTERPOSE_LOG=2 -- --cache-mib "$mib" ||
		fail "start: $(tail -n 2 "$T/$name/job.log" | tr '\n' ' ')"
	cmd 300 verify || fail "verify before: $CMDERR"
	before=$(answers)
	cmd 300 gen || fail "gen before: $CMDERR"
	tokens=$(answers)
	out=$T/$name/incr
	: >"$out"
	say "--- $name: full dump (leave running)"
	incr_dump "$d/1" --leave-running
	echo "full $DUMP_S $SYNC_S $(carriers_stored "$d/1") $(carriers_apparent "$d/1")" >>"$out"
	for g in 1 2; do cmd 300 gen || fail "gen $g: $CMDERR"; done
	say "--- $name: dump against the full one (leave running)"
	CUINTERPOSE_PARENT=$d/1 incr_dump "$d/2" --leave-running
	echo "second $DUMP_S $SYNC_S $(carriers_stored "$d/2") $(carriers_apparent "$d/2")" >>"$out"
	for g in 1 2; do cmd 300 gen || fail "gen $g: $CMDERR"; done
	say "--- $name: live pre-copy, then the final dump against it"
	t0=$(date +%s.%N)
	"$BUNDLE/bin/cuinterpose" precopy "$JOBPID" "$d/pre" || fail "cuinterpose precopy failed"
	echo "precopy $(echo "$(date +%s.%N) $t0" | awk '{printf "%.3f", $1 - $2}') 0 $(carriers_stored "$d/pre") $(carriers_apparent "$d/pre")" >>"$out"
	cmd 300 gen || fail "gen after the pre-copy: $CMDERR"
	CUINTERPOSE_PARENT=$d/pre incr_dump "$d/3"
	echo "final $DUMP_S $SYNC_S $(carriers_stored "$d/3") $(carriers_apparent "$d/3")" >>"$out"
	# The final dump's pause beside the parts it must not exceed by more
	# than 0.15 s: NVIDIA's native checkpoint and criu's own dump (its
	# whole time less the plugin's QUIESCE..SAVE and IMAGES phases).
	echo "pause $PAUSE $(phase_s "$d/3/dump.log" SAVE) $(phase_s "$d/3/dump.log" QUIESCE) $(native_s "$d/3/dump.log")" >>"$out"
	wait_gone $(tree_pids) || fail "dumped processes still alive"
	drop_caches || fail "cannot drop the page cache (not root?)"
	CRIU_TIMEOUT=550 criu_do restore "$d/3" "$T/plugins" ||
		fail "restore through the chain failed: $(grep -E 'Error|cuinterpose:.*(refus|fail)' "$d/3/restore.log" | tail -n 2 | tr '\n' ' ')"
	echo "restore $SECS 0 $(du -B1 -c "$d"/*/cuinterpose-carrier-*.img | tail -n 1 | cut -f1) 0" >>"$out"
	grep -h "cuinterpose: LOAD" "$d/3/restore.log" | sed 's/^.*cuinterpose: /  /'
	cmd 300 verify || fail "after the restore through the chain: $CMDERR"
	[ "$(answers)" = "$before" ] || fail "answers changed: $(answers | tr '\n' ' ') vs $(echo $before)"
	cmd 300 gen || fail "gen after the restore: $CMDERR"
	[ "$(answers)" = "$tokens" ] || fail "generation differs after the restore through the chain"
	cmd 30 exit
	kill -9 $(tree_pids) 2>/dev/null
	kill_job
	for g in 1 2 3 pre; do drop_images "$d/$g"; done
	echo ok >"$T/why"
}

run_bench_incr() {
	local g name o base plain
	part_start bench-incr
	for g in ${BENCH_INCR_GIB:-8}; do
		name=bench-incr-${g}G
		bench_one bench_incr bench-incr-${g}G ours "$g"
		o=$T/$name-ours/incr
		[ -s "$o" ] || continue
		result "$name-chain" DONE "$(awk '{printf "%s%s %.2fs + sync %.2fs, carriers store %.0f MiB of %.0f MiB", (NR > 1 ? "; " : ""), $1, $2, $3, $4 / 1048576, $5 / 1048576}' "$o")"
		result "$name-written" "$(awk '$1 == "full" {f = $4} $1 == "second" {s = $4} END {print (f > 0 && s <= 0.05 * f) ? "MET" : "MISSED"}' "$o")" \
			"$(awk '$1 == "full" {f = $4} $1 == "second" {s = $4} END {printf "second dump of the unchanged inference job stores %.1f MiB = %.4f of the first %.0f MiB (target <= 0.05)", s / 1048576, (f > 0 ? s / f : 0), f / 1048576}' "$o")"
		result "$name-pause" "$(awk '$1 == "pause" {print ($4 <= 0.15) ? "MET" : "MISSED"}' "$o")" \
			"$(awk '$1 == "pause" {printf "final dump against the pre-copy: CUDA calls held %.2fs, threads frozen %.2fs; of it SAVE %.2fs (target <= 0.15 beyond the native checkpoint and criu'"'"'s own dump), QUIESCE %.2fs, native checkpoint %.2fs", $2, $3, $4, $5, $6}' "$o")"
		plain=$T/bench-llm-${g}G-ours/bench-cold
		if [ -f "$plain" ]; then
			result "$name-frozen" DONE "$(awk 'NR == FNR {p = $1; next} $1 == "precopy" {c = $2} $1 == "final" {printf "final dump against a live pre-copy (%.2fs, the job running): %.2fs with the job frozen, + sync %.2fs; a plain dump of the same job %.2fs = %.2fx", c, $2, $3, p, $2 / p}' "$plain" "$o")"
		fi
		base=$T/bench-llm-${g}G-base/bench-cold
		if [ -f "$base" ]; then
			result "$name-durable" "$(awk 'NR == FNR {u = $1 + $8; next} $1 == "second" {print ($2 + $3 <= 0.2 * u) ? "MET" : "MISSED"}' "$base" "$o")" \
				"$(awk 'NR == FNR {u = $1 + $8; next} $1 == "second" {printf "second dump until durable %.2fs / upstream cold dump until durable %.2fs = %.3f (target <= 0.2)", $2 + $3, u, ($2 + $3) / u}' "$base" "$o")"
		fi
	done
	part_end bench-incr
}
run_bench_share() { run_bench_sizes bench-share bench_share 0.25 $BENCH_SHARE_GIB; }

run_bench_carrier() {
	local gib=${BENCH_CARRIER_GIB:-8} f=${BENCH_CARRIER_FILES:-16} why d
	part_start bench-carrier
	SC_RC=0
	d=$(bench_dir bench-carrier)
	mkdir -p "$d"
	why=$(room $((gib * 1024 * 2)) $((gib * 1024 + 4096)))
	if [ -n "$why" ]; then
		result bench-carrier SKIP "$why"
	else
		timeout -k 5 550 "${R[@]}" "$WL/carrier-bench" -x -F "$f" -s "${gib}G" -r 3 -t 0,8,16 -w 16 -n -d "$d" \
			>"$T/logs/bench-carrier.log" 2>&1
		sed 's/^/  /' "$T/logs/bench-carrier.log"
		if grep -q '^striped over' "$T/logs/bench-carrier.log"; then
			result bench-carrier "$(awk '/^striped over/ {split($0, a, " = "); s = a[2] + 0; split(a[3], b, " "); l = b[1] + 0; print (s >= 0.8 && l >= 0.8) ? "MET" : "MISSED"}' "$T/logs/bench-carrier.log")" \
				"$(grep '^striped over' "$T/logs/bench-carrier.log")"
		else
			result bench-carrier FAIL "$(tail -n 2 "$T/logs/bench-carrier.log" | tr '\n' ' ')"
		fi
	fi
	rm -rf "$d"
	part_end bench-carrier
}
