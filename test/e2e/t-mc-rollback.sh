# Multicast through the rollback path, two ranks: a failure once
# PREPARE_MULTICAST began tearing the team down (an importer's multicast
# unmap, SAVE's device-to-host copy, an importer's unmap in PREPARE_UNICAST,
# the native lock) fails the dump, and
# the job keeps running with the object rebuilt: same addresses, every byte,
# writes through each rank's multicast mapping reach both members, no FD or
# mapping leaked. Then `criu dump --leave-running` twice (in-place restore).
. "$srcdir/lib.sh"
N=2
export FAKECUDA_DEVICES=$N FAKECUDA_MC_ROUND_MB=8
export FAKECUDA_FAIL_DIR=$T/faults
# One malloc arena: a thread's first malloc would otherwise map a new 64 MiB
# arena that is never unmapped, which is not a leak.
export MALLOC_ARENA_MAX=1
mkdir -p "$FAKECUDA_FAIL_DIR"
WORKLOAD=$B/test/e2e/e2e_mc
[ -x "$WORKLOAD" ] || skip "workload not built"
K=0
GEN=0

export CENSUS_DEVMEM=1 # lib.sh census: FDs, mappings and device memory

# (writes_reach_everyone: every rank writes through its multicast mapping in turn; all see it)

# rolled_back WHAT PHASE-LINE [criu dump args]: the dump fails in PHASE and
# the job is as it was.
rolled_back() {
	what=$1
	phase=$2
	shift 2
	K=$((K + 1))
	note "dump fault $K: $what"
	criu_dump "$T/f$K" "$@" >"$T/f$K.out" 2>&1 && fail "$what: criu dump succeeded"
	disarm
	log=$T/f$K/dump.log
	grep -q "cuinterpose: PREPARE_MULTICAST: $N participants" "$log" || fail "$what: multicast not torn down"
	grep -q "$phase" "$log" || fail "$what: no '$phase' in dump.log"
	grep -q "REBUILD_MC_BINDINGS: $N participants" "$log" || fail "$what: multicast not rebuilt"
	grep -q "rollback complete" "$log" || fail "$what: rollback did not complete"
	intact "$what"
	writes_reach_everyone
}

start_reference 0 8

# rank 1's multicast unmap fails after rank 0 released the object: the
# rollback finishes rank 1's teardown before the team is rebuilt
arm "$(pid_of 1)" cuMemUnmap:1
rolled_back "cuMemUnmap in PREPARE_MULTICAST" "PREPARE_MULTICAST failed"
arm "$(pid_of 0)" cuMemcpyDtoHAsync:1
rolled_back "cuMemcpyDtoHAsync in SAVE" "SAVE failed"
# rank 1 unmaps its multicast VA (PREPARE_MULTICAST), its member's temporary
# carrier mapping (SAVE), then its member and the unicast import
arm "$(pid_of 1)" cuMemUnmap:3
rolled_back "cuMemUnmap in PREPARE_UNICAST" "PREPARE_UNICAST failed"
arm any cuCheckpointProcessLock:1
rolled_back "cuCheckpointProcessLock" "cuCheckpointProcessLock"

for i in 1 2; do
	note "dump --leave-running $i"
	criu_dump "$T/l$i" --leave-running || fail "criu dump --leave-running ($i)"
	grep -q "in-place restore complete" "$T/l$i/dump.log" || fail "no in-place restore in dump.log"
	grep -q "REBUILD_MC_BINDINGS: $N participants" "$T/l$i/dump.log" || fail "multicast not rebuilt in place"
	intact "--leave-running $i"
	writes_reach_everyone
done
cmd $N exit
note done
