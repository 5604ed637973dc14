# Private tracked memory goes through the carrier (the default,
# CUINTERPOSE_PRIVATE=carrier): two processes with only private memory
# (each a 3 MiB + 4 KiB cuMemAlloc, 4 MiB once rounded, and a 2 MiB
# never-shared POSIX-capable cuMemCreate), then a job of small cuMemAlloc
# buffers (slab pieces). For each:
#  - the carrier images hold every private allocation (or live piece),
#    `cuinterpose show` lists them as carried, and the fake's native
#    checkpoint (FAKECUDA_CKPT_LOG) saved 0 bytes: only the context;
#  - two dump/restore cycles keep every byte and address;
#  - a dump whose SAVE fails rolls back with the job intact, and a
#    --leave-running dump rebuilds private memory in place.
# Then CUINTERPOSE_PRIVATE=native: the same job's private memory goes
# through native checkpoint (6 MiB per process), none through the carrier;
# any other value makes the job's first cuInit fail naming it.
. "$srcdir/lib.sh"
CLI=$B/cli/cuinterpose
export FAKECUDA_FAIL_DIR=$T/faults
export FAKECUDA_CKPT_LOG=$T/native.log
mkdir -p "$FAKECUDA_FAIL_DIR"


# native_saved DIR: what every native checkpoint of the last dump saved,
# "BYTES ALLOCATIONS" per line, sorted (the log is cut per dump).
native_saved() {
	awk '{print $6, $9}' "$T/native.log" | sort
}

# carried_show SHOW: allocation lines show marks "carried", and the carrier
# entries (lines "  ID  size" or "  ID piece +OFF" under "carriers (N):").
count_carried() { grep -cE "^  [0-9a-f]+:[0-9]+  size .*  carried$" "$1"; }
count_native() { grep -cE "^  [0-9a-f]+:[0-9]+  size .*  native$" "$1"; }
count_entries() { awk '/^carriers \(/ {n += substr($2, 2) + 0} END {print n + 0}' "$1"; }

# ---- large private allocations: e2e_group --private, two processes ----
WORKLOAD=$B/test/e2e/e2e_group
[ -x "$WORKLOAD" ] || skip "workload not built"
N=2
start_job $N --private
cmd $N verify 0
before=$(answers $N)
for cycle in 1 2; do
	pids=$(job_pids)
	note "private, cycle $cycle: dump"
	rm -f "$T/native.log"
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	grep -q "cuinterpose: SAVE: 2 participants, 4 records, 12582912 bytes" "$T/d$cycle/dump.log" ||
		fail "SAVE did not carry 2 x (4 + 2) MiB of private memory: $(grep 'cuinterpose: SAVE' "$T/d$cycle/dump.log")"
	[ "$(native_saved)" = "0 0
0 0" ] || fail "native checkpoint saved device memory: $(cat "$T/native.log")"
	wait_gone $pids || fail "dumped processes still alive"
	"$CLI" show "$T/d$cycle" >"$T/show$cycle.txt" 2>&1 || { cat "$T/show$cycle.txt"; fail "show"; }
	grep -q "^OK: every image decodes and is consistent; 12582912 carrier bytes" "$T/show$cycle.txt" ||
		fail "show: carrier bytes: $(grep '^OK\|^FAIL' "$T/show$cycle.txt")"
	[ "$(count_carried "$T/show$cycle.txt")" = 4 ] || fail "show: $(count_carried "$T/show$cycle.txt") carried allocations, not 4"
	[ "$(count_native "$T/show$cycle.txt")" = 0 ] || fail "show: allocations left to native"
	[ "$(count_entries "$T/show$cycle.txt")" = 4 ] || fail "show: $(count_entries "$T/show$cycle.txt") carrier entries, not 4"
	note "private, cycle $cycle: restore"
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	grep -q "cuinterpose: LOAD: 2 participants, 4 records, 12582912 bytes" "$T/d$cycle/restore.log" ||
		fail "LOAD did not refill the private memory"
	cmd $N verify 0
	[ "$(answers $N)" = "$before" ] || fail "addresses changed: $(answers $N) vs $before"
done

note "private: a SAVE that fails rolls back"
arm "$JOBPID" cuMemcpyDtoHAsync:2
if criu_dump "$T/f1" >"$T/f1.out" 2>&1; then
	fail "criu dump with a failing device copy succeeded"
fi
disarm
grep -q "cuinterpose: SAVE failed on pid $JOBPID: .*saving device memory: .*cuMemcpyDtoHAsync" "$T/f1/dump.log" ||
	fail "no SAVE failure naming the copy: $(grep -m3 'cuinterpose.*fail' "$T/f1/dump.log")"
for p in $(job_pids); do alive "$p" || fail "pid $p died in the rollback"; done
cmd $N verify 0
[ "$(answers $N)" = "$before" ] || fail "rollback: addresses changed"

note "private: --leave-running"
criu_dump "$T/l1" --leave-running || fail "criu dump --leave-running"
grep -q "in-place restore complete" "$T/l1/dump.log" || fail "no in-place restore"
cmd $N verify 0
[ "$(answers $N)" = "$before" ] || fail "--leave-running: addresses changed"
cmd $N exit
wait_gone $(job_pids) || fail "job did not exit"

# ---- the same job with CUINTERPOSE_PRIVATE=native ----
note "CUINTERPOSE_PRIVATE=native"
export CUINTERPOSE_PRIVATE=native
start_job $N --private
cmd $N verify 0
before=$(answers $N)
pids=$(job_pids)
rm -f "$T/native.log"
criu_dump "$T/n1" || fail "criu dump (native)"
grep -q "cuinterpose: SAVE: 0 participants, 0 records" "$T/n1/dump.log" ||
	fail "SAVE carried something though private memory is left to native: $(grep 'cuinterpose: SAVE' "$T/n1/dump.log")"
[ "$(native_saved)" = "6291456 2
6291456 2" ] || fail "native checkpoint did not save 2 x 6 MiB: $(cat "$T/native.log")"
wait_gone $pids || fail "dumped processes still alive"
"$CLI" show "$T/n1" >"$T/shown.txt" 2>&1 || { cat "$T/shown.txt"; fail "show (native)"; }
[ "$(count_native "$T/shown.txt")" = 4 ] || fail "show: $(count_native "$T/shown.txt") allocations marked native, not 4"
[ "$(count_carried "$T/shown.txt")" = 0 ] || fail "show: private allocations carried under CUINTERPOSE_PRIVATE=native"
criu_restore "$T/n1" || fail "criu restore (native)"
cmd $N verify 0
[ "$(answers $N)" = "$before" ] || fail "native: addresses changed"
cmd $N exit
wait_gone $(job_pids) || fail "job did not exit"

# A value that is neither: the job's first cuInit fails naming it.
job_refused CUINTERPOSE_PRIVATE=bogus
grep -q "cuinterpose: pid [0-9]*: CUINTERPOSE_PRIVATE=bogus: want carrier|native; cuInit fails (nothing has changed)" \
	"$T/refused.log" || fail "no message for CUINTERPOSE_PRIVATE=bogus: $(cat "$T/refused.log")"
unset CUINTERPOSE_PRIVATE

# ---- slab pieces: e2e_slab, rank 0's private slabs ----
WORKLOAD=$B/test/e2e/e2e_slab
[ -x "$WORKLOAD" ] || skip "slab workload not built"
N=2
start_job $N
cmd $N verify 0
before=$(answers $N)
for cycle in 1 2; do
	pids=$(job_pids)
	note "slabs, cycle $cycle"
	rm -f "$T/native.log"
	criu_dump "$T/s$cycle" || fail "criu dump of slabs (cycle $cycle)"
	[ "$(native_saved)" = "0 0
0 0" ] || fail "native checkpoint saved slab memory: $(cat "$T/native.log")"
	wait_gone $pids || fail "dumped processes still alive"
	"$CLI" show "$T/s$cycle" >"$T/shows$cycle.txt" 2>&1 || { cat "$T/shows$cycle.txt"; fail "show"; }
	# Rank 0's private slabs (owner native, carried): one carrier entry per
	# live piece, with its size.
	awk '
		/^  [0-9a-f]+:[0-9]+  size / {
			id = $1
			priv = / owner native / && / origin malloc / && / creator this process/ && / carried$/
			next
		}
		priv && /^      piece \+/ { want[id " " $2] = $4; np++ }
		/^  [0-9a-f]+:[0-9]+ piece \+/ { got[$1 " " $3] = $8 }
		END {
			if (np == 0) { print "no private slab pieces in show"; exit 1 }
			for (k in want) if (got[k] != want[k]) { print "piece " k ": carrier " got[k] ", live " want[k]; exit 1 }
		}' "$T/shows$cycle.txt" || fail "private slab pieces are not all carried"
	criu_restore "$T/s$cycle" || fail "criu restore of slabs (cycle $cycle)"
	cmd $N verify 0
	[ "$(answers $N)" = "$before" ] || fail "slabs: addresses changed"
done
cmd $N churn
cmd $N verify 0
cmd $N exit
note done
