# Multicast across two ranks on two fake devices: rank 0 creates the object
# (capacity rounded up to 8 MiB, 4 MiB requested) and binds with BindMem v1,
# rank 1 imports it, binds with BindAddr_v2 after unbinding a slice and
# binding it again by address; a unicast allocation is shared beside it.
# After restore: every byte of every member, of the multicast mappings and of
# the unicast allocation, the same addresses, and a write through each
# rank's multicast mapping reaches both members. Twice.
. "$srcdir/lib.sh"
N=${MC_RANKS:-2}
export FAKECUDA_DEVICES=$N FAKECUDA_MC_ROUND_MB=8
WORKLOAD=$B/test/e2e/e2e_mc
[ -x "$WORKLOAD" ] || skip "workload not built"

start_job "$N" 8
cmd "$N" write 0 0
cmd "$N" verify 0
before=$(answers "$N")
"$B/cli/cuinterpose" inspect "$JOBPID" >"$T/inspect.txt" || fail "cuinterpose inspect"
grep -q "multicast  requested 4194304  effective 8388608  handle types" "$T/inspect.txt" ||
	fail "inspect: no multicast sizes: $(cat "$T/inspect.txt")"
grep -qE "mc device 0  GPU-[0-9a-f-]{36}  participant" "$T/inspect.txt" || fail "inspect: no multicast device"
grep -qE "mc binding device 0  mc offset 0  member [0-9a-f]{16}:[0-9]+  member offset 0  size [0-9]+  BindMem  v1" \
	"$T/inspect.txt" || fail "inspect: no BindMem v1 binding: $(cat "$T/inspect.txt")"
"$B/cli/cuinterpose" inspect --json "$JOBPID" | grep -q '"bind":"BindMem","abi":"v1"' ||
	fail "inspect --json: no multicast binding"
gen=0
for cycle in 1 2; do
	pids=$(job_pids)
	note "cycle $cycle: dump"
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	grep -q "cuinterpose: PREPARE_MULTICAST: $N participants" "$T/d$cycle/dump.log" ||
		fail "no PREPARE_MULTICAST line"
	wait_gone $pids || fail "dumped processes still alive"
	note "cycle $cycle: restore"
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	grep -q "REBUILD_MC_BINDINGS: $N participants" "$T/d$cycle/restore.log" ||
		fail "no multicast rebuild in restore.log"
	cmd "$N" verify $gen
	[ "$(answers "$N")" = "$before" ] || fail "addresses changed: $(answers "$N") vs $before"
	for r in $(seq 0 $((N - 1))); do
		gen=$((gen + 1))
		cmd "$N" write "$r" $gen
		cmd "$N" verify $gen
	done
done
cmd "$N" exit
note done
