# Processes without the interposer that share a memory pool by descriptor:
# the plugin cannot see the pool; the driver's native checkpoint leaves a
# descriptor of its device open in each of them (on the H200 /dev/nvidiactl,
# chr 195:255; on the fake its device node, test/fakecuda/mempools.c), and
# their native restore fails with CUDA_ERROR_OPERATING_SYSTEM (docs/driver-facts.md, "Stream-ordered pools shared by descriptor").
# The dump must fail, naming the pid and the descriptor, instead of
# claiming that descriptor like a forked child's and writing images whose
# restore cannot work; nothing is restored from such a dump.
. "$srcdir/lib.sh"
WORKLOAD=$B/test/e2e/e2e_pool
[ -x "$WORKLOAD" ] || skip "workload not built"
command -v losetup >/dev/null || skip "losetup (util-linux) not installed"
NODE=$(losetup -f 2>/dev/null) || skip "no free loop device for the fake driver's device node"
export FAKECUDA_DEVNODE=$NODE

setsid env LD_PRELOAD="$SAN_PRELOAD" "$FAKERUN" "$WORKLOAD" "$T/w" 3 --shared </dev/null >"$T/job.log" 2>&1 &
JOB=$!
wait_ready 3
cmd 3 write 0 6
cmd 3 write 1 6
cmd 3 write 2 6
cmd 3 verify 6
for p in $(job_pids); do
	[ "$(for f in /proc/"$p"/fd/*; do readlink "$f"; done | grep -c "^$NODE\$")" -ge 2 ] ||
		fail "pid $p does not hold the pool channel's descriptor of $NODE beside its own"
done
note "dump"
criu_dump "$T/d" && fail "criu dumped processes sharing a pool natively"
has_line "$T/d/dump.log" "pid [0-9]+ still holds 1 descriptor\(s\) of the driver's devices \($NODE\) after its native checkpoint \(a memory pool shared with another process keeps one; its native restore would fail\)" \
	"no refusal naming the descriptor"
grep -q "cuinterpose-devfile-" "$T/d/dump.log" && fail "a CUDA process's descriptor was claimed"
ls "$T/d"/cuinterpose-devfile-*.img >/dev/null 2>&1 && fail "a descriptor image was written"
note done
