# Pools that cache freed memory, as JAX's cuda_async allocator leaves its
# preallocation (each rank: its device's default pool with the release
# threshold raised to keep everything, and a private pool, each holding a
# freed 64 MiB block beside its live 2 MiB one). Before the native
# checkpoint the interposer trims every pool to what live allocations use,
# so the native checkpoint does not copy the cache into the process and
# criu's images stay small; at RESUME each pool takes as much again. Two
# cycles: the live blocks keep every byte and address, each pool holds the
# same reserved and used bytes as before the dump, and the pools allocate
# and free afterwards. Then a dump that lets the job run on (RESUME in
# place) does the same. Last, the fake driver fails a trim in rank 0 and
# taking the cache back in rank 1: the dump still succeeds (the native
# checkpoint copies that pool's cache), each rank says what failed, and the
# job runs on with its bytes, rank 1's pool growing again on demand.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_pool
[ -x "$WORKLOAD" ] || skip "workload not built"
CACHE_MIB=64
export FAKECUDA_FAIL_DIR=$T/faults
mkdir -p "$FAKECUDA_FAIL_DIR"

CUINTERPOSE_LOG=2 start_job 2 --cache $CACHE_MIB
cmd 2 verify 0
before=$(answers 2)
cmd 2 pools
pools=$(answers 2)
# each pool holds its live 2 MiB block and the freed cache
echo "$pools" | awk -v c=$((CACHE_MIB << 20)) -v b=$((2 << 20)) '
	$2 != "default" || $3 < b + c || $4 != b || $5 != "private" || $6 < b + c || $7 != b { bad = 1 }
	END { exit bad }' || fail "the pools do not hold their cache before the dump: $pools"

# images_mib DIR: the MiB of criu's page images
images_mib() { du -cm "$1"/pages-*.img | tail -n1 | cut -f1; }

for cycle in 1 2; do
	for r in 0 1; do cmd 2 write $r $((cycle + 10)); done
	cmd 2 verify $((cycle + 10))
	cmd 2 pools
	pre=$(answers 2)
	pids=$(job_pids)
	logged=$(stat -c %s "$T/job.log")
	note "dump $cycle"
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	wait_gone $pids || fail "dumped processes still alive"
	# every rank: both pools gave back at least their cache
	n=$(tail -c +$((logged + 1)) "$T/job.log" | sed -n 's/.*memory pools: 2 pool(s) gave back \([0-9]*\) MiB.*/\1/p' |
		awk -v c=$((2 * CACHE_MIB)) '$1 >= c { n++ } END { print n + 0 }')
	[ "$n" = 2 ] || fail "cycle $cycle: not every rank trimmed its pools: $(grep "memory pool" "$T/job.log")"
	m=$(images_mib "$T/d$cycle")
	# without the trim the native checkpoint copies 2 x 2 x 64 MiB of cache
	[ "$m" -lt $((CACHE_MIB * 2)) ] || fail "cycle $cycle: $m MiB of page images: the pools' cache was copied"
	echo "cycle $cycle: page images $m MiB (the ranks' pools cached $((4 * CACHE_MIB)) MiB)"
	note "restore $cycle"
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	cmd 2 verify $((cycle + 10))
	[ "$(answers 2 | awk '{print $2, $3, $4, $5}')" = "$(echo "$before" | awk '{print $2, $3, $4, $5}')" ] ||
		fail "addresses changed: $(answers 2) vs $before"
	cmd 2 pools
	[ "$(answers 2)" = "$pre" ] || fail "cycle $cycle: the pools hold $(answers 2), not $pre as before"
	[ "$(tail -c +$((logged + 1)) "$T/job.log" | grep -c "memory pools: took back the [0-9]* MiB")" = 2 ] ||
		fail "cycle $cycle: a rank's pools did not take their cache back: $(grep "memory pool" "$T/job.log")"
	# the pools still allocate and free; what they cache after that is
	# the driver's choice, but never less than before
	cmd 2 churn
	cmd 2 pools
	paste -d' ' <(echo "$pre") <(answers 2) | awk '
		$3 > $10 || $4 != $11 || $6 > $13 || $7 != $14 { bad = 1 } END { exit bad }' ||
		fail "cycle $cycle: after churn the pools hold $(answers 2), before the dump $pre"
done

note "dump, leaving the job running"
for r in 0 1; do cmd 2 write $r 21; done
cmd 2 pools
pre=$(answers 2)
logged=$(stat -c %s "$T/job.log")
criu_dump "$T/d3" --leave-running || fail "criu dump --leave-running"
cmd 2 verify 21
cmd 2 pools
[ "$(answers 2)" = "$pre" ] || fail "after the dump in place the pools hold $(answers 2), not $pre"
[ "$(tail -c +$((logged + 1)) "$T/job.log" | grep -c "memory pools: took back the [0-9]* MiB")" = 2 ] ||
	fail "the job ran on without its pools' cache: $(grep "memory pool" "$T/job.log" | tail -n 4)"
m3=$(images_mib "$T/d3")

note "a trim and a taking back that fail"
p0=$(pid_of 0)
p1=$(pid_of 1)
arm "$p0" cuMemPoolTrimTo:1:CUDA_ERROR_INVALID_VALUE
arm "$p1" cuMemAllocFromPoolAsync:1:CUDA_ERROR_OUT_OF_MEMORY
logged=$(stat -c %s "$T/job.log")
criu_dump "$T/d4" --leave-running || fail "criu dump with a failing trim"
disarm
tail -c +$((logged + 1)) "$T/job.log" >"$T/faults.log"
grep -q "cuinterpose\[$p0\]: memory pool .*: cuMemPoolTrimTo failed: invalid argument (the native checkpoint copies its [0-9]* MiB)" \
	"$T/faults.log" || fail "rank 0 does not say its trim failed: $(cat "$T/faults.log")"
grep -q "cuinterpose\[$p1\]: memory pool .*: taking back [0-9]* MiB failed: out of memory (it grows again on demand)" \
	"$T/faults.log" || fail "rank 1 does not say taking back failed: $(cat "$T/faults.log")"
m4=$(images_mib "$T/d4")
[ "$m4" -ge $((m3 + CACHE_MIB)) ] || fail "the untrimmed pool's cache is not in the images: $m4 MiB, $m3 MiB before"
echo "a pool that could not trim: page images $m4 MiB, $m3 MiB when all trimmed"
cmd 2 verify 21
cmd 2 pools
now=$(answers 2)
# rank 0's pools hold what they held; one of rank 1's holds only what is used
[ "$(echo "$now" | head -n1)" = "$(echo "$pre" | head -n1)" ] || fail "rank 0's pools: $now, before $pre"
echo "$now" | tail -n1 | awk -v b=$((2 << 20)) '($3 == b) + ($6 == b) == 1 { ok = 1 } END { exit !ok }' ||
	fail "rank 1 should have one pool without its cache: $now"
cmd 2 churn
for r in 0 1; do cmd 2 write $r 22; done
cmd 2 verify 22
cmd 2 exit
note done
