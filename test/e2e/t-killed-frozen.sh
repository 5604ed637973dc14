# criu killed with the job frozen by --freeze-cgroup (#21): the guardian
# thaws the freezer cgroup before it restores and rebuilds the job.
. "$srcdir/lib.sh"

export MALLOC_ARENA_MAX=1
N=2
FRZ=/sys/fs/cgroup/freezer
[ -w "$FRZ" ] || skip "no writable cgroup v1 freezer at $FRZ"
named_cgroups_mountable
CG=$FRZ/cuip-killed-$$
mkdir "$CG" || skip "cannot create a freezer cgroup"
# drop_cgroup: thaw the cgroup, kill what is left in it (the job) and wait
# (5 s at most) until it is empty: a cgroup that holds a task, even one
# dying, cannot be removed.
drop_cgroup() {
	local p i

	echo THAWED >"$CG/freezer.state" 2>/dev/null
	for ((i = 0; i < 50; i++)); do
		p=$(cat "$CG/cgroup.procs" 2>/dev/null)
		[ -z "$p" ] && break
		kill -9 $p 2>/dev/null
		nap 0.1
	done
	rmdir "$CG" || echo "cannot remove $CG: it holds $(cat "$CG/cgroup.procs" 2>/dev/null | tr '\n' ' ')"
}
at_exit drop_cgroup

start_job $N
for p in $JOBPID $(job_pids); do echo "$p" >"$CG/cgroup.procs" || fail "cannot move pid $p into $CG"; done
cmd $N write 1 1
cmd $N verify 1
before=$(answers $N)
note "dump --leave-running --freeze-cgroup"
criu_dump "$T/warm" --leave-running --freeze-cgroup "$CG" || fail "dump with --freeze-cgroup"
cmd $N verify 1
# The plugin has CRIU seize without freezing (interrupt-only), so the
# cgroup is frozen here by hand while criu is held at the native checkpoint,
# as a criu that froze it would leave it; the bound then ends criu.
note "stop@native-checkpoint, cgroup frozen, bound 1000 ms"
CUINTERPOSE_GUARDIAN_STOP_MS=1000 CUINTERPOSE_TEST_FAULT=stop@native-checkpoint \
	criu_dump "$T/f" --freeze-cgroup "$CG" >/dev/null 2>&1 &
dumper=$!
for _ in $(seq 600); do
	grep -qs "stop at native-checkpoint" "$T/f/dump.log" && break
	nap 0.05
done
grep -qs "stop at native-checkpoint" "$T/f/dump.log" || fail "criu did not reach the native checkpoint"
echo FROZEN >"$CG/freezer.state"
glog=$T/f/cuinterpose-guardian.log
for _ in $(seq 600); do
	grep -qs "rollback complete\|ROLLBACK FAILED" "$glog" && break
	nap 0.05
done
wait $dumper
grep -qs "rollback complete" "$glog" || fail "no completed rollback: $(cat "$glog" 2>&1)"
grep -q "thawed the freezer cgroup $CG (freezer.state was FR[EOZING]*)" "$glog" ||
	fail "the cgroup was not thawed: $(cat "$glog")"
[ "$(cat "$CG/freezer.state")" = THAWED ] || fail "$CG is $(cat "$CG/freezer.state")"
cmd $N verify 1
[ "$(answers $N)" = "$before" ] || fail "addresses changed"
cmd $N exit
note done
