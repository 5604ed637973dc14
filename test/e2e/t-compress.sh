# Compressed carrier chunks (CUINTERPOSE_CARRIER_COMPRESS=zstd in the
# job's environment). The job's patterned bytes pack well: each dump's
# carrier files store at most a quarter of the bytes they index, the SAVE
# lines count the chunks stored compressed, `cuinterpose show` lists them
# and verifies every chunk through its frame, and the restore gives back
# every byte and address.
#  - A second dump, incremental against the first, writes the one chunk
#    the job changed (compressed too) and inherits the rest; the restore
#    through the chain decompresses chunks from both directories.
#  - A frame damaged in the first dump's images (its magic number), of a
#    chunk the second inherits, is refused: by show, by the plugin's full
#    read (CUINTERPOSE_VERIFY_BEFORE_RESTORE=1) and by LOAD, which kills the
#    restored tree instead of resuming it. The byte put back, the chain
#    restores.
. "$srcdir/lib.sh"

need_holes
CLI=$B/cli/cuinterpose

# stored_ratio DIR: fails unless the carrier files store <= 1/4 of their size.
stored_ratio() {
	local app=0 sto=0 f
	for f in "$1"/cuinterpose-carrier-*.img; do
		[ -f "$f" ] || continue
		app=$((app + $(stat -c %s "$f"))) sto=$((sto + $(stored "$f")))
	done
	[ "$app" -ge $((16 << 20)) ] || fail "$1: carrier files of $app bytes in all"
	[ $((sto * 4)) -le "$app" ] || fail "$1: the carrier files store $sto of their $app bytes (compression off?)"
	echo "$1: $sto of $app bytes stored"
}

CUINTERPOSE_CARRIER_COMPRESS=zstd CUINTERPOSE_LOG=2 start_job 2
cmd 2 verify 0

note "dump 1: full, compressed"
l0=$(wc -l <"$T/job.log")
criu_dump "$T/d1" --leave-running || fail "criu dump 1"
stored_ratio "$T/d1"
z=$(tail -n +$((l0 + 1)) "$T/job.log" | grep -o "[0-9]* bytes of chunks stored compressed in [0-9]*" |
	awk '{r += $1; s += $7} END {print r + 0, s + 0}')
set -- $z
[ "$1" -ge $((16 << 20)) ] && [ $(($2 * 4)) -le "$1" ] ||
	fail "dump 1's SAVE lines count $1 bytes of chunks stored compressed in $2: $(grep 'stored compressed' "$T/job.log" | head -n 2)"
"$CLI" show --json "$T/d1" >"$T/show1.json" || fail "show d1: $(cat "$T/show1.json")"
n1=$(grep -o '"status":"OK"' "$T/show1.json" | wc -l)
[ "$n1" -gt 0 ] && [ "$(grep -o '"status":' "$T/show1.json" | wc -l)" = "$n1" ] || fail "show d1: not every entry OK"
grep -q '"compressed_chunks":[1-9]' "$T/show1.json" || fail "show d1 lists no compressed chunk"
"$CLI" show "$T/d1" | grep -q "chunks stored compressed (zstd)" || fail "show d1 (text) lists no compressed chunk"

cmd 2 write 0 1
cmd 2 verify 1
before=$(answers 2)
pids=$(job_pids)
note "dump 2: against d1, the job stops"
CUINTERPOSE_PARENT=$T/d1 criu_dump "$T/d2" || fail "criu dump 2: $(tail -5 "$T/d2/dump.log")"
wait_gone $pids || fail "dumped processes still alive"
grep -q "SAVE: [0-9]* of [0-9]* carried bytes left to the parent checkpoint $T/d1, 1048576 written" "$T/d2/dump.log" ||
	fail "dump 2's SAVE summary: $(grep 'left to the parent' "$T/d2/dump.log")"
"$CLI" show "$T/d2" >"$T/show2.txt" 2>&1 || fail "show d2: $(cat "$T/show2.txt")"
[ "$(grep -c '  OK$' "$T/show2.txt")" = "$n1" ] || fail "show d2 did not verify the $n1 entries: $(cat "$T/show2.txt")"

note "a damaged frame in d1, of a chunk d2 inherits"
car=$(ls "$T"/d1/cuinterpose-carrier-*.img | head -1)
name=$(basename "$car")
flip_byte "$car" $((1 << 20)) # chunk 1 of the file's first entry: its magic number
"$CLI" show "$T/d1" >"$T/show1b.txt" 2>&1 && fail "show d1 passed a damaged frame: $(cat "$T/show1b.txt")"
grep -q "$name: corrupt: allocation .* chunk 1 (bytes 1048576\.\.[0-9]*): its zstd frame does not decompress" "$T/show1b.txt" ||
	fail "show d1 does not name the damaged frame: $(grep -i corrupt "$T/show1b.txt")"
refused() { # WHAT PATTERN
	criu_restore "$T/d2" && fail "$1: criu restore exited 0 for a tree that was killed"
	grep -Eq "$2" "$T/d2/restore.log" ||
		fail "$1: restore.log does not report the damaged frame: $(grep -E 'corrupt|decompress' "$T/d2/restore.log" | head -n 3)"
	grep -q "cuinterpose: RESUME: " "$T/d2/restore.log" && fail "$1: the job was resumed"
	wait_gone $pids || fail "$1: restored processes still alive"
}
refused LOAD "chunk 1 \(file offset 1048576 of [^ ]*$name\) does not decompress from its [0-9]+ bytes for its 1048576 \(corrupt carrier image\)"
grep -q "killing the restored tree" "$T/d2/restore.log" || fail "LOAD: restored tree not killed"
CUINTERPOSE_VERIFY_BEFORE_RESTORE=1 refused "full read" "$name: corrupt: a frame that does not decompress in chunk 1"
flip_byte "$car" $((1 << 20))

note "restore through the chain"
criu_restore "$T/d2" || fail "criu restore of d2: $(grep -E 'Error|refus|fail' "$T/d2/restore.log" | tail -n 2)"
cmd 2 verify 1
[ "$(answers 2)" = "$before" ] || fail "answers after restore differ: $(answers 2) vs $before"
cmd 2 exit
note done
