#!/bin/bash
# private-bench.sh - issue 17: dump + restore time of a job holding only
# private memory, its private memory carried (CUINTERPOSE_PRIVATE=carrier,
# the default) against left to native checkpoint (CUINTERPOSE_PRIVATE=native),
# both in the same run, on the fake driver. Run by `make -C test/e2e
# bench-private [BENCH_ARGS="MIB ..."]` (default 256 1024).
#
# The job: e2e_group --private, NPROC processes (PRIVATE_BENCH_PROCS,
# default 2), each a MIB MiB cuMemAlloc plus a 2 MiB private cuMemCreate.
# Device-copy models (the fake's): native checkpoint and restore move
# device memory at FAKECUDA_CKPT_US_PER_MB (default 1000 = ~1 GB/s: the H200
# measured 0.4-1.8 GB/s), host<->device copies (the carrier's) at
# FAKECUDA_COPY_US_PER_MB (default 20 = ~50 GB/s, PCIe). Disk and CRIU costs
# are this machine's. Every restore is verified (every byte, every address).
# Peak extra resident memory of every process (test/gpu/rss.sh), dump and
# restore: VmHWM over the RSS before the dump, and RssAnon over RssAnon
# before (the fake maps device memory into the process, so its VmRSS also
# counts device pages the copies touch; RssAnon holds staging and the rest).
set -u
: "${top_builddir:?run through make -C test/e2e bench-private}"
srcdir=${srcdir:-$(cd "$(dirname "$0")/../e2e" && pwd)}
. "$srcdir/lib.sh"
. "$srcdir/../gpu/rss.sh"
# The carrier's own staging default, not lib.sh's 4 MiB for tests.
if [ -n "${PRIVATE_BENCH_STAGING_MB:-}" ]; then
	export CUINTERPOSE_STAGING_MB=$PRIVATE_BENCH_STAGING_MB
else
	unset CUINTERPOSE_STAGING_MB
fi
export FAKECUDA_CKPT_US_PER_MB=${FAKECUDA_CKPT_US_PER_MB:-1000}
export FAKECUDA_COPY_US_PER_MB=${FAKECUDA_COPY_US_PER_MB:-20}
N=${PRIVATE_BENCH_PROCS:-2}
# PRIVATE_BENCH_SHARED=1: the job also shares e2e_group's 18 MiB from rank 0
# (the other ranks import it): RSS of importers too.
JOBARGS=--private
[ "${PRIVATE_BENCH_SHARED:-0}" = 1 ] && JOBARGS=
SIZES=${*:-256 1024}
export FAKECUDA_MEM_MB=$(( (${SIZES##* } + 64) * N * 2 + 1024 ))

run_one() { # MODE MIB: prints "dump restore dumpHWM restoreHWM dumpANON restoreANON" (s, MiB)
	local t0 t1 t2 pids
	export CUINTERPOSE_PRIVATE=$1 E2E_PRIVATE_MB=$2
	start_job $N $JOBARGS
	cmd $N verify 0
	before=$(answers $N)
	pids=$(job_pids)
	rm -rf "$T/img"
	rss_start "$T/rss-d" $pids
	t0=$(date +%s.%N)
	# CRIU's own 10 s limit is not the benchmark's: 2 GiB per process on
	# a loaded 2-core machine took 13.6 s of SAVE
	criu_dump "$T/img" --timeout 300 || fail "$1 $2 MiB: criu dump"
	t1=$(date +%s.%N)
	wait_gone $pids || fail "$1 $2 MiB: dumped processes still alive"
	rss_stop "$T/rss-d"
	rss_start "$T/rss-r" "$T/rss-d" $pids
	t2=$(date +%s.%N)
	criu_restore "$T/img" || fail "$1 $2 MiB: criu restore"
	t3=$(date +%s.%N)
	sleep 0.2
	rss_stop "$T/rss-r"
	echo "  $1 $2 MiB, extra RSS MiB per process (VmHWM; RssAnon): dump $(rss_extra "$T/rss-d" | awk '{printf "%s ", $2}'); $(rss_extra "$T/rss-d" anon | awk '{printf "%s ", $2}') restore $(rss_extra "$T/rss-r" | awk '{printf "%s ", $2}'); $(rss_extra "$T/rss-r" anon | awk '{printf "%s ", $2}')" >&9
	cmd $N verify 0
	[ "$(answers $N)" = "$before" ] || fail "$1 $2 MiB: addresses changed"
	cp "$T/img/dump.log" "$T/$1-$2.dump.log" && cp "$T/img/restore.log" "$T/$1-$2.restore.log"
	cmd $N exit
	wait_gone $(job_pids) || fail "$1 $2 MiB: job did not exit"
	echo "$t0 $t1 $t2 $t3 $(rss_max "$T/rss-d") $(rss_max "$T/rss-r") $(rss_max "$T/rss-d" anon) $(rss_max "$T/rss-r" anon)" |
		awk '{printf "%.2f %.2f %s %s %s %s", $2 - $1, $4 - $3, $5, $6, $7, $8}'
	unset CUINTERPOSE_PRIVATE E2E_PRIVATE_MB
}

echo "private-bench: $(uname -n), $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$srcdir" rev-parse --short HEAD 2>/dev/null)"
echo "  $N processes${JOBARGS:+ ($JOBARGS)}${JOBARGS:- (rank 0 shares 18 MiB with the others)}; staging ${CUINTERPOSE_STAGING_MB:-default} MiB; native model ${FAKECUDA_CKPT_US_PER_MB} us/MiB, copy model ${FAKECUDA_COPY_US_PER_MB} us/MiB"
echo "| MiB private per process | carrier dump | carrier restore | native dump | native restore | carrier/native (dump+restore) | carrier extra RSS dump / restore, max of the processes (VmHWM; RssAnon) | native extra RSS dump / restore (VmHWM; RssAnon) |"
echo "|---|---|---|---|---|---|---|---|"
for mib in $SIZES; do
	c=$(run_one carrier "$mib") || exit 1
	n=$(run_one native "$mib") || exit 1
	echo "$mib $c $n" | awk '{printf "| %d + 2 | %.2f s | %.2f s | %.2f s | %.2f s | %.2fx | %s / %s MiB; %s / %s MiB | %s / %s MiB; %s / %s MiB |\n", $1, $2, $3, $8, $9, ($2 + $3) / ($8 + $9), $4, $5, $6, $7, $10, $11, $12, $13}'
done
