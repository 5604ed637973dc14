# Striped carriers (CUINTERPOSE_TEST_CARRIER_FILES=3): two processes with only
# private memory (4 MiB + 2 MiB each, chunks of 1 MiB) write their carrier
# over three files each, 2 MiB per file (the stripe unit is one chunk
# here); `cuinterpose show` reads and verifies the striped images; two
# dump/restore cycles keep every byte and address. Then a stripe file
# missing, one cut short, and one with a flipped byte (found by the
# interposer's LOAD, which checks each chunk as it reads it):
# each restore is refused with a message naming the file, the allocation
# and the chunk, and the restored tree is killed instead of resumed. (The
# refusals come first: ASan builds skip at a second restore of one process.)
# Last, one cycle with LOAD's copies synchronous (criu's
# CUINTERPOSE_TEST_LOAD_COPIES=sync; every asynchronous copy would fail), after a
# restore refused for a bad value.
. "$srcdir/lib.sh"
CLI=$B/cli/cuinterpose
export CUINTERPOSE_TEST_CARRIER_FILES=3
N=2
MiB=1048576

# stripes DIR PID: the sizes of PID's three carrier files, or "missing".
stripes() {
	for f in "$1/cuinterpose-carrier-$2.img" "$1/cuinterpose-carrier-$2-1.img" "$1/cuinterpose-carrier-$2-2.img"; do
		[ -f "$f" ] && stat -c %s "$f" || echo missing
	done | tr '\n' ' '
}

# refused DIR WHY PATTERN: the restore fails, restore.log names it, and the
# restored tree is killed.
refused() {
	pids=$(job_pids)
	criu_restore "$1" && echo "(criu restore exited 0)"
	grep -qE "$3" "$1/restore.log" || fail "$2: restore.log lacks /$3/: $(grep 'cuinterpose:' "$1/restore.log" | tail -3)"
	grep -q "killing the restored tree" "$1/restore.log" || fail "$2: restored tree not killed"
	wait_gone $pids || fail "$2: restored processes still alive"
}

# dumped DIR: a fresh job, verified, dumped; sets P to its first pid.
dumped() {
	start_job $N --private
	cmd $N verify 0
	pids=$(job_pids)
	criu_dump "$1" || fail "criu dump ($1)"
	wait_gone $pids || fail "dumped processes still alive"
	P=$(echo $pids | awk '{print $1}')
}

note "a missing stripe file"
dumped "$T/m"
rm "$T/m/cuinterpose-carrier-$P-2.img"
"$CLI" show "$T/m" >"$T/showm.txt" 2>&1 && fail "show accepts a missing stripe"
grep -q "cuinterpose-carrier-$P-2.img: missing" "$T/showm.txt" || fail "show: $(grep -i missing "$T/showm.txt")"
refused "$T/m" "missing stripe" "cuinterpose-carrier-$P-2.img: missing \(allocation [0-9a-f]+:[0-9]+ chunk [0-9]+\)"

note "a truncated stripe file"
dumped "$T/t"
truncate -s $((2 * MiB - 5)) "$T/t/cuinterpose-carrier-$P-1.img"
refused "$T/t" "truncated stripe" "cuinterpose-carrier-$P-1.img: truncated: 2097147 bytes, the index needs 2097152 \(allocation [0-9a-f]+:[0-9]+ chunk [0-9]+\)"

note "a corrupt stripe, found by the interposer's LOAD"
dumped "$T/c"
flip_byte "$T/c/cuinterpose-carrier-$P-1.img" $((MiB + 7))
refused "$T/c" "corrupt stripe" \
	"allocation [0-9a-f]+:[0-9]+: chunk [0-9]+ \(bytes [0-9]+-[0-9]+, file offset [0-9]+\) of cuinterpose-carrier-$P-1.img has crc32c"

CUINTERPOSE_LOG=2 start_job $N --private
cmd $N verify 0
before=$(answers $N)
for cycle in 1 2; do
	pids=$(job_pids)
	note "cycle $cycle: dump"
	criu_dump "$T/d$cycle" || fail "criu dump (cycle $cycle)"
	wait_gone $pids || fail "dumped processes still alive"
	for p in $pids; do
		[ "$(stripes "$T/d$cycle" "$p")" = "$((2 * MiB)) $((2 * MiB)) $((2 * MiB)) " ] ||
			fail "pid $p's carrier is not 3 x 2 MiB: $(stripes "$T/d$cycle" "$p")"
	done
	[ ! -e "$T/d$cycle/cuinterpose-carrier-$p-3.img" ] || fail "a fourth stripe file"
	# each process logs where its carrier's time went (CUINTERPOSE_LOG=2)
	[ "$(grep -cE "saved 2 carrier entries, 6291456 bytes: [0-9.]+ s \([0-9]+ MB/s\) after [0-9.]+ s of mapping; [0-9]+ threads, [0-9]+ buffers of 1024 KiB \([0-9]+ KiB pinned\); summed over the threads: pin [0-9.]+ s, copy wait [0-9.]+ s, file I/O [0-9.]+ s, crc [0-9.]+ s" "$T/job.log")" = $((N * cycle)) ] ||
		fail "the carriers' time is not logged: $(grep 'saved' "$T/job.log")"
	"$CLI" show "$T/d$cycle" >"$T/show$cycle.txt" 2>&1 || { cat "$T/show$cycle.txt"; fail "show"; }
	grep -q "^OK: every image decodes and is consistent; 12582912 carrier bytes" "$T/show$cycle.txt" ||
		fail "show: $(grep '^OK\|^FAIL' "$T/show$cycle.txt")"
	[ "$(grep -c "^  striped over 3 files: cuinterpose-carrier-[0-9]*.img cuinterpose-carrier-[0-9]*-1.img cuinterpose-carrier-[0-9]*-2.img$" "$T/show$cycle.txt")" = 2 ] ||
		fail "show does not list 3 stripe files per process"
	[ "$(grep -c "^    striped: [0-9]* extents over 3 files$" "$T/show$cycle.txt")" = 4 ] ||
		fail "show does not list the extents of 4 entries"
	"$CLI" show --json "$T/d$cycle" >"$T/show$cycle.json" 2>&1 || fail "show --json"
	grep -q '"extents":\[{"file":' "$T/show$cycle.json" || fail "show --json lists no extents"
	note "cycle $cycle: restore"
	criu_restore "$T/d$cycle" || fail "criu restore (cycle $cycle)"
	grep -q "cuinterpose: LOAD: 2 participants, 4 records, 12582912 bytes" "$T/d$cycle/restore.log" ||
		fail "LOAD did not refill the private memory"
	cmd $N verify 0
	[ "$(answers $N)" = "$before" ] || fail "addresses changed: $(answers $N) vs $before"
	[ "$(grep -cE "loaded 2 carrier entries, 6291456 bytes: .* buffers of 1024 KiB \([0-9]+ KiB pinned\)" "$T/job.log")" = $((N * cycle)) ] ||
		fail "the carriers' load time is not logged: $(grep 'loaded' "$T/job.log")"
done
kill -9 $(job_pids) 2>/dev/null
wait_gone $(job_pids) || fail "job still alive"

note "LOAD with synchronous copies (criu's CUINTERPOSE_TEST_LOAD_COPIES)"
export FAKECUDA_FAIL_DIR=$T/faults
mkdir -p "$FAKECUDA_FAIL_DIR"
CUINTERPOSE_LOG=2 start_job $N --private
cmd $N verify 0
before=$(answers $N)
pids=$(job_pids)
criu_dump "$T/s" || fail "criu dump (synchronous copies)"
wait_gone $pids || fail "dumped processes still alive"
CUINTERPOSE_TEST_LOAD_COPIES=synchronous criu_restore "$T/s" -o restore-bad.log && fail "criu restore took CUINTERPOSE_TEST_LOAD_COPIES=synchronous"
grep -q 'CUINTERPOSE_TEST_LOAD_COPIES=synchronous: want async|sync' "$T/s/restore-bad.log" ||
	fail "the bad value is not named: $(grep cuinterpose "$T/s/restore-bad.log" | tail -3)"
wait_gone $pids || fail "the refused restore left processes"
# Any asynchronous host-to-device copy fails from here: the restore passes
# only if LOAD made none.
arm any "cuMemcpyHtoDAsync:1"
CUINTERPOSE_TEST_LOAD_COPIES=sync criu_restore "$T/s" || fail "criu restore (synchronous copies)"
disarm
grep -q "injected failure of cuMemcpyHtoDAsync" "$T/job.log" && fail "LOAD made an asynchronous copy"
cmd $N verify 0
[ "$(answers $N)" = "$before" ] || fail "addresses changed with synchronous copies: $(answers $N) vs $before"
[ "$(grep -cE "loaded 2 carrier entries, 6291456 bytes: .*KiB pinned, synchronous copies\)" "$T/job.log")" = $N ] ||
	fail "LOAD did not copy synchronously: $(grep 'loaded' "$T/job.log")"
kill -9 $(job_pids) 2>/dev/null
wait_gone $(job_pids) || fail "job still alive"
JOB=
note done
