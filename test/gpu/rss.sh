# rss.sh - peak extra resident memory of every process of a job during a
# dump or a restore, sourced by test/gpu/bench.sh (the GPU suite) and
# test/bench/private-bench.sh (the fake driver).
#
#   rss_start DIR [BASEDIR] PIDS...   one sampler per pid, in the background
#   rss_stop DIR                      stop them; DIR/PID holds one line:
#                                     "PID BASE_RSS PEAK_HWM BASE_ANON PEAK_ANON" (KiB)
#   rss_extra DIR [anon]              "PID EXTRA_MIB" per process: PEAK_HWM - BASE_RSS
#                                     (anon: PEAK_ANON - BASE_ANON)
#   rss_max DIR [anon]                the largest EXTRA_MIB of DIR
#
# A sampler reads /proc/PID/status every 10 ms: VmHWM after resetting it to
# the current RSS (`echo 5 > /proc/PID/clear_refs`, as root; without it the
# peak of the VmRSS samples counts), and RssAnon (the fake driver maps its
# device memory into the process: VmRSS there includes device pages the
# copies touch, RssAnon does not). Dump: the base is the process's RSS when
# its sampler starts; the sampler stops with the process (CRIU kills it
# after the dump) or at rss_stop. Restore: the pids do not exist yet; each
# sampler waits for its pid, takes its base from BASEDIR (the same
# process's line of the dump: "more than before the checkpoint") and resets
# VmHWM once when the pid appears. RSS_SERIES=1: every sample also goes to
# DIR/PID.series.txt as "EPOCH VmRSS RssAnon" (KiB), to see which phase of a
# dump holds the memory.
rss_sample() { # OUT PID BASE_RSS BASE_ANON
	local out=$1 p=$2 brss=${3:-} banon=${4:-} k v _ hwm=0 anon=0 seen=0 rss=0 a=0
	while [ ! -e "${out%/*}/stop" ]; do
		if [ -r "/proc/$p/status" ]; then
			if [ $seen = 0 ]; then
				seen=1
				if [ -z "$brss" ]; then
					while read -r k v _; do
						case "$k" in VmRSS:) brss=$v ;; RssAnon:) banon=$v ;; esac
					done <"/proc/$p/status"
				fi
				echo 5 >"/proc/$p/clear_refs" 2>/dev/null
			fi
			while read -r k v _; do
				case "$k" in
				VmHWM:) [ "$v" -gt "$hwm" ] && hwm=$v ;;
				VmRSS:) rss=$v ;;
				RssAnon:) a=$v ;;
				esac
			done 2>/dev/null <"/proc/$p/status"
			[ "$rss" -gt "$hwm" ] && hwm=$rss
			[ "$a" -gt "$anon" ] && anon=$a
			[ -n "${RSS_SERIES:-}" ] && echo "${EPOCHREALTIME:-0} $rss $a" >>"$out.series.txt"
		elif [ $seen = 1 ]; then
			break
		fi
		sleep 0.01
	done
	echo "$p ${brss:-0} $hwm ${banon:-0} $anon" >"$out"
}

rss_start() { # DIR [BASEDIR] PIDS...
	local d=$1 base= p b
	shift
	[ -d "${1:-}" ] && { base=$1; shift; }
	rm -rf "$d" && mkdir -p "$d"
	RSS_SAMPLERS=
	for p in "$@"; do
		b=
		[ -n "$base" ] && [ -f "$base/$p" ] && b=$(awk '{print $2, $4}' "$base/$p")
		# shellcheck disable=SC2086
		# not holding the caller's stdout: a $(...) around rss_start
		# would wait for the sampler
		rss_sample "$d/$p" "$p" $b </dev/null >/dev/null 2>&1 &
		RSS_SAMPLERS="$RSS_SAMPLERS $!"
	done
}

rss_stop() { # DIR
	touch "$1/stop"
	# shellcheck disable=SC2086
	[ -n "${RSS_SAMPLERS:-}" ] && wait $RSS_SAMPLERS
	RSS_SAMPLERS=
	rm -f "$1/stop"
}

rss_extra() { # DIR [anon]
	local f
	for f in "$1"/[0-9]*; do
		[ -f "$f" ] && [ "${f%.series.txt}" = "$f" ] || continue
		awk -v anon="${2:-}" '{e = anon ? $5 - $4 : $3 - $2; printf "%d %.1f\n", $1, (e > 0 ? e : 0) / 1024}' "$f"
	done
}

rss_max() { # DIR [anon]
	rss_extra "$@" | awk 'BEGIN {m = 0} $2 > m {m = $2} END {printf "%.1f\n", m}'
}
