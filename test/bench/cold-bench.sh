#!/bin/bash
# cold-bench.sh - issue 30: restore from cold storage, each carrier byte
# read once (verification with LOAD, CUINTERPOSE_VERIFY_BEFORE_RESTORE=0, the
# default) against read twice (=1: every carrier read and checked before
# LOAD), and a job whose reserved, never-written memory is left as holes,
# in the same run, on the fake driver. Run by `make -C test/e2e bench-cold
# [BENCH_ARGS="MIB ..."]` (default 256 1024), as root (it drops the page
# cache).
#
# The job: e2e_group --private, 2 processes, each MIB MiB written (private
# cuMemAlloc, carried) plus COLD_BENCH_RESERVED_MB (default MIB/2) never
# written. Each run: criu dump, then `sync` (counted: the dump is over when
# its bytes are durable), the page cache dropped, criu restore (timed), the
# job verified (every byte, every address). The ceiling: the plain parallel
# cold read of the images' stored bytes (test/gpu/plainio.py, PLAINIO_COLD,
# 1..4 threads) in the same directory, same run. Disk and CRIU costs are
# this machine's; device copies follow the fake's model
# (FAKECUDA_COPY_US_PER_MB, default 20 = ~50 GB/s).
set -u
: "${top_builddir:?run through make -C test/e2e bench-cold}"
srcdir=${srcdir:-$(cd "$(dirname "$0")/../e2e" && pwd)}
. "$srcdir/lib.sh"
[ "$(id -u)" = 0 ] || skip "dropping the page cache needs root"
unset CUINTERPOSE_STAGING_MB
export FAKECUDA_COPY_US_PER_MB=${FAKECUDA_COPY_US_PER_MB:-20}
SIZES=${*:-256 1024}
N=2
export FAKECUDA_MEM_MB=$(((${SIZES##* } * 2 + 64) * N * 2 + 1024))

secs() { echo "$(date +%s.%N) $1" | awk '{printf "%.3f", $1 - $2}'; }

run_one() { # VERIFY MIB RESERVED: "dump sync restore stored_mib apparent_mib" into $T/row
	local cb_t0 dump_s sync_s rest_s pids
	export E2E_PRIVATE_MB=$2 E2E_RESERVED_MB=$3
	start_job $N --private
	cmd $N verify 0
	before=$(answers $N)
	pids=$(job_pids)
	rm -rf "$T/img"
	cb_t0=$(date +%s.%N)
	criu_dump "$T/img" --timeout 300 || fail "$2 MiB: criu dump"
	dump_s=$(secs "$cb_t0")
	cb_t0=$(date +%s.%N)
	timeout 600 sync || fail "$2 MiB: sync after the dump did not return within 600 s"
	sync_s=$(secs "$cb_t0")
	wait_gone $pids || fail "$2 MiB: dumped processes still alive"
	timeout 600 sync && echo 3 >/proc/sys/vm/drop_caches || fail "$2 MiB: cannot drop the page cache"
	cb_t0=$(date +%s.%N)
	CUINTERPOSE_VERIFY_BEFORE_RESTORE=$1 criu_restore "$T/img" || fail "$2 MiB: criu restore"
	rest_s=$(secs "$cb_t0")
	cmd $N verify 0
	[ "$(answers $N)" = "$before" ] || fail "$2 MiB: addresses changed"
	echo "$dump_s $sync_s $rest_s $(du -sm "$T/img" | cut -f1) $(du -sm --apparent-size "$T/img" | cut -f1)" >"$T/row"
	cmd $N exit
	wait_gone $(job_pids) || fail "$2 MiB: job did not exit"
	unset E2E_PRIVATE_MB E2E_RESERVED_MB
}

plain_cold_read() { # MIB: best cold read GB/s of that many MiB
	timeout 900 python3 "$srcdir/../gpu/plainio.py" "$T" $(($1 << 20)) 1 2 4 | tee -a /dev/stderr | awk '/^best/ {print $8}'
}

echo "cold-bench: $(uname -n), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$srcdir" rev-parse --short HEAD 2>/dev/null), images in $(df -P "$T" | awk 'NR == 2 {print $1}')"
echo "  $N processes, each MIB written + RESERVED never written (private, carried); copy model ${FAKECUDA_COPY_US_PER_MB} us/MiB"
echo "| MiB written + reserved per process | images stored / apparent | dump + sync | cold restore, read once (default) | cold restore, verified first | once / twice | plain cold read of the stored bytes | once / plain |"
echo "|---|---|---|---|---|---|---|---|"
for mib in $SIZES; do
	resv=${COLD_BENCH_RESERVED_MB:-$((mib / 2))}
	run_one 0 "$mib" "$resv" >&2 && once=$(cat "$T/row") || exit 1
	run_one 1 "$mib" "$resv" >&2 && twice=$(cat "$T/row") || exit 1
	stored=$(echo "$once" | awk '{print $4}')
	gbs=$(PLAINIO_COLD=1 plain_cold_read "$stored")
	# fields: MIB RESV, once: dump sync restore stored apparent, twice:
	# the same, the plain cold read's GB/s
	echo "$mib $resv $once $twice $gbs" | awk '{pl = $6 * 1048576 / ($13 * 1e9);
		printf "| %d + %d | %d / %d MiB | %.2f + %.2f s | %.2f s | %.2f s | %.2f | %.2f s (%s GB/s) | %.2f |\n",
		$1, $2, $6, $7, $3, $4, $5, $10, $5 / $10, pl, $13, $5 / pl}'
done
