# A job moved to a machine with other GPUs (another devd: same two fake
# GPUs, other UUIDs), restored with CUINTERPOSE_GPU_REMAP:
# - without it the restore is refused when criu starts, before any process
#   exists, naming the images' GPUs (ordinal, UUID, model), this machine's,
#   and the exact CUINTERPOSE_GPU_REMAP value; the images stay good;
# - a pair onto a GPU this machine lacks is refused, naming it;
# - `auto` where the pairing is not clear (the machine has one GPU) is
#   refused, saying why;
# - the value the refusal printed restores the job: every byte, address and
#   the sharing (a write seen by every rank) checked;
# - moved back, `auto` restores it (each pair logged).
. "$srcdir/lib.sh"

N=2
export FAKECUDA_DEVICES=2 FAKECUDA_UUID_SEED=11

# refused DIR: the restore failed before any process of the job existed
refused() {
	local p
	for p in $pids; do alive "$p" && fail "pid $p exists after a refused restore"; done
	grep -q "Forking task" "$1/restore.log" && fail "criu created processes before the refusal"
	return 0
}

start_job $N
GEN=0
cmd $N verify $GEN
before=$(answers $N)
pids=$(job_pids)
A=$(uuids)

note "dump on machine A ($A)"
criu_dump "$T/d1" || fail "criu dump"
wait_gone $pids || fail "the dumped job did not exit"
machine 22
Bm=$(uuids)
[ "$Bm" != "$A" ] || fail "machine B has the same UUIDs: $Bm"

note "restore on machine B ($Bm) without CUINTERPOSE_GPU_REMAP"
criu_restore "$T/d1" && fail "restored onto other GPUs without a remap"
refused "$T/d1"
line=$(grep -o "restore refused before any process was created: .*" "$T/d1/restore.log")
[ -n "$line" ] || fail "no refusal line: $(grep -E "Error|cuinterpose" "$T/d1/restore.log" | tail -n 5)"
for u in $A $Bm; do
	case "$line" in *"$u"*) ;; *) fail "the refusal does not name $u: $line" ;; esac
done
echo "$line" | grep -Eq "made on GPU\(s\) 0 GPU-[0-9a-f-]+ \([^)]+\), 1 GPU-" || fail "GPUs not listed with ordinal and model: $line"
VALUE=$(echo "$line" | sed -n 's/.*restore with CUINTERPOSE_GPU_REMAP=\([^ ]*\) (or =auto)$/\1/p')
[ -n "$VALUE" ] || fail "no value to set in: $line"
[ "$VALUE" = "$(paste -d= <(echo $A | tr ' ' '\n') <(echo $Bm | tr ' ' '\n') | paste -sd,)" ] ||
	fail "suggested $VALUE, not the pairs by ordinal"

note "a pair onto a GPU this machine lacks"
CUINTERPOSE_GPU_REMAP="${A%% *}=GPU-00000000-0000-0000-0000-000000000001" criu_restore "$T/d1" && fail "restored with a pair onto a missing GPU"
refused "$T/d1"
grep -q "CUINTERPOSE_GPU_REMAP maps a GPU onto GPU-00000000-0000-0000-0000-000000000001, which this machine does not have" \
	"$T/d1/restore.log" || fail "no refusal naming the missing target: $(grep Error "$T/d1/restore.log" | tail -n 3)"

note "auto on a machine with one GPU"
machine 22 1
CUINTERPOSE_GPU_REMAP=auto criu_restore "$T/d1" && fail "auto restored onto one GPU"
refused "$T/d1"
grep -q "no pairing is clear (the images saw 2 GPU(s), this machine has 1)" "$T/d1/restore.log" ||
	fail "no reason given: $(grep Error "$T/d1/restore.log" | tail -n 3)"

note "restore on machine B with the value printed"
machine 22
CUINTERPOSE_GPU_REMAP=$VALUE criu_restore "$T/d1" || fail "criu restore with CUINTERPOSE_GPU_REMAP=$VALUE"
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed: $(answers $N) (was $before)"
GEN=1
cmd $N write $((N - 1)) $GEN
cmd $N verify $GEN

note "dump on machine B, back to machine A with auto"
criu_dump "$T/d2" || fail "criu dump on machine B"
wait_gone $pids || fail "the dumped job did not exit"
machine 11
CUINTERPOSE_GPU_REMAP=auto criu_restore "$T/d2" || fail "criu restore with auto"
for u in $A; do
	grep -q "CUINTERPOSE_GPU_REMAP=auto: GPU GPU-[0-9a-f-]* of the images restores onto $u" "$T/d2/restore.log" ||
		fail "auto's pair onto $u not logged"
done
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed: $(answers $N) (was $before)"
cmd $N write 0 2
cmd $N verify 2
cmd $N exit
note done
