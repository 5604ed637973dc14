# criu killed part-way through the dump of a multicast team (#21): the
# guardian rebuilds the multicast object (creators, importers, devices,
# bindings) as the coordinator's own rollback would: same addresses, every
# byte, writes through each rank's multicast mapping reach both members, no
# FD or mapping leaked; a dump --leave-running works afterwards.
. "$srcdir/lib.sh"
N=2
export FAKECUDA_DEVICES=$N FAKECUDA_MC_ROUND_MB=8
export MALLOC_ARENA_MAX=1 # see t-mc-rollback.sh
WORKLOAD=$B/test/e2e/e2e_mc
[ -x "$WORKLOAD" ] || skip "workload not built"
K=0
GEN=0

export CENSUS_DEVMEM=1 # lib.sh census: FDs, mappings and device memory

start_reference 0 8

for point in begin:PREPARE_MULTICAST PREPARE_MULTICAST SAVE begin:PREPARE_UNICAST PREPARE_UNICAST native-checkpoint; do
	K=$((K + 1))
	note "kill $K: kill@$point"
	CUINTERPOSE_TEST_FAULT=kill@$point criu_dump "$T/f$K" >"$T/f$K.out" 2>&1 && fail "$point: criu dump succeeded"
	guardian_done "$T/f$K"
	grep -q "guardian.*REBUILD_MC_BINDINGS\|REBUILD_MC_BINDINGS: $N participants" "$T/f$K/dump.log" ||
		fail "$point: multicast not rebuilt"
	intact "$point"
	writes_reach_everyone
done

note "dump --leave-running"
criu_dump "$T/l" --leave-running || fail "criu dump --leave-running after the kills"
cmd $N verify $GEN
writes_reach_everyone
cmd $N exit
note done
