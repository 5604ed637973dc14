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

writes_reach_everyone() {
	for k in $(seq 0 $((N - 1))); do
		GEN=$((GEN + 1))
		cmd $N write "$k" $GEN
		cmd $N verify $GEN
	done
}

start_job $N 8
cmd $N write 0 $GEN
cmd $N verify $GEN
before=$(answers $N)
criu_dump "$T/warm" --leave-running || fail "warm-up dump"
cmd $N verify $GEN
census_keep 10

for point in begin:PREPARE_MULTICAST PREPARE_MULTICAST SAVE begin:PREPARE_UNICAST PREPARE_UNICAST native-checkpoint; do
	K=$((K + 1))
	note "kill $K: kill@$point"
	CUINTERPOSE_FAULT=kill@$point criu_dump "$T/f$K" >"$T/f$K.out" 2>&1 && fail "$point: criu dump succeeded"
	glog=$T/f$K/cuinterpose-guardian.log
	for _ in $(seq 600); do
		grep -qs "rollback complete\|ROLLBACK FAILED" "$glog" && break
		sleep 0.05
	done
	grep -qs "rollback complete" "$glog" || fail "$point: no completed rollback: $(cat "$glog" 2>&1)"
	grep -q "guardian.*REBUILD_MC_BINDINGS\|REBUILD_MC_BINDINGS: $N participants" "$T/f$K/dump.log" ||
		fail "$point: multicast not rebuilt"
	for p in $(job_pids); do alive "$p" || fail "$point: pid $p died"; done
	cmd $N verify $GEN
	[ "$(answers $N)" = "$before" ] || fail "$point: addresses changed: $(answers $N) vs $before"
	census_back 5 "$point"
	writes_reach_everyone
done

note "dump --leave-running"
criu_dump "$T/l" --leave-running || fail "criu dump --leave-running after the kills"
cmd $N verify $GEN
writes_reach_everyone
cmd $N exit
note done
