#!/usr/bin/env bash
# staging-sweep.sh - the striped carrier's SAVE and LOAD rates against the
# best plain parallel write/read in the same run, for several staging sizes
# (and so several buffer sizes per thread): whether buffers small enough to
# stay in the host's last-level cache between the device copy and the CRC
# (the copy then writes into the cache, not DRAM) make the save faster.
#
#   bundle/scripts/staging-sweep.sh DIR [STAGING_MIB:CHUNK_MIB ...]
#
# A slot's buffer is at most 2 MiB (carrier/xfer.h BUF_MAX) or one chunk where
# that is more, so at 16 threads the default pairs give 8, 4, 2 and 1 MiB
# buffers: 224:8, 224:4, 224:1 (the plugin's defaults) and 32:1. (The
# first measurements, before BUF_MAX, had 8 and 4 MiB buffers from 256:4
# and 128:4.) Each pair is one carrier-bench -x run (8 GiB, 16 files, 16
# threads, 3 runs, medians) that measures its own plain baseline; prints
# carrier-bench's striped rows, per-thread sums and the ratio line per pair.
# SWEEP_GIB (8) and SWEEP_THREADS (16) change the size and the thread count.
set -u
S=$(cd "$(dirname "$0")" && pwd)
BUNDLE=${BUNDLE:-$(cd "$S/.." && pwd)}
export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
dir=${1:?usage: staging-sweep.sh DIR [STAGING_MIB:CHUNK_MIB ...]}
shift
[ $# -gt 0 ] || set -- 224:8 224:4 224:1 32:1
mkdir -p "$dir"
rc=0
for pair in "$@"; do
	st=${pair%%:*} ch=${pair##*:}
	echo "== staging $st MiB, chunk $ch MiB"
	out=$(timeout -k 5 300 "$BUNDLE/workloads/carrier-bench" -x -F 16 -s "${SWEEP_GIB:-8}G" -r 3 \
		-t "${SWEEP_THREADS:-16}" -w 16 -n -S "$st" -c "$ch" -d "$dir" 2>&1) || rc=1
	printf '%s\n' "$out" | awk '/^carrier striped/ {on = 1} on && /^ / {print} /^striped over/ {print}'
	printf '%s\n' "$out" | grep -q '^striped over' || { printf '%s\n' "$out" | tail -n 5; rc=1; }
	rm -f "$dir"/carrier-bench-*
done
exit $rc
