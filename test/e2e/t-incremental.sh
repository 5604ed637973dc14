# Incremental checkpoints (CUINTERPOSE_PARENT): a chain of three dumps of
# one job, each written against the one before, restored from the last.
#  - The first (full) dump hashes every carrier chunk (`cuinterpose show`
#    lists the entries as hashed). After one 64 KiB write into one shared
#    allocation, the second dump writes that chunk only: its carrier files
#    store at most 2 MiB of the 30 MiB they index, the interposer leaves
#    all but that 1 MiB chunk to the parent, show verifies every chunk
#    through the chain.
#  - A third dump after another write and a new shared allocation (whose
#    entry inherits nothing), against the second, kills the job; show
#    verifies it through the chain, the restore reads each chunk where the chain holds it (three
#    directories) and the job finds its bytes, addresses and last write.
#  - Refused before anything is touched: a dump whose parent chain lacks a
#    link (the job keeps running, show names the missing directory), a
#    dump whose parent is its own directory, and a restore whose parent was
#    overwritten by another dump since (changed parent; no process is left,
#    and the job's pids stay free).
. "$srcdir/lib.sh"

need_holes
CLI=$B/cli/cuinterpose

CUINTERPOSE_LOG=2 start_job 2
cmd 2 verify 0
before=$(answers 2)

note "dump 1: full"
criu_dump "$T/d1" --leave-running || fail "criu dump 1"
"$CLI" show --json "$T/d1" >"$T/show1.json" || fail "show d1: $(cat "$T/show1.json")"
grep -q '"parent":null' "$T/show1.json" || fail "d1 names a parent: $(cat "$T/show1.json")"
n1=$(grep -o '"hashed":' "$T/show1.json" | wc -l)
[ "$n1" -gt 0 ] && [ "$(grep -o '"hashed":true' "$T/show1.json" | wc -l)" = "$n1" ] || fail "d1: not every entry hashed"
cmd 2 write 0 1
cmd 2 verify 1

note "dump 2: against d1"
l0=$(wc -l <"$T/job.log")
CUINTERPOSE_PARENT=$T/d1 criu_dump "$T/d2" --leave-running || fail "criu dump 2: $(tail -5 "$T/d2/dump.log")"
grep -q "incremental dump: parent checkpoint $T/d1" "$T/d2/dump.log" || fail "dump 2 did not read its parent"
grep -q "SAVE: [0-9]* of [0-9]* carried bytes left to the parent checkpoint $T/d1, 1048576 written" "$T/d2/dump.log" ||
	fail "dump 2's SAVE summary: $(grep 'left to the parent' "$T/d2/dump.log")"
app=0 sto=0
for f in "$T"/d2/cuinterpose-carrier-*.img; do
	app=$((app + $(stat -c %s "$f"))) sto=$((sto + $(stored "$f")))
done
[ "$app" -ge $((16 << 20)) ] || fail "d2: carrier files of $app bytes in all"
[ "$sto" -le $((2 << 20)) ] || fail "d2: the carrier files store $sto of $app bytes for one changed 1 MiB chunk"
# The SAVE lines of dump 2: everything but the written chunk left to d1.
left=$(tail -n +$((l0 + 1)) "$T/job.log" | grep -o "[0-9]* bytes left to the parent" | awk '{n += $1} END {print n + 0}')
[ "$left" = $((app - (1 << 20))) ] ||
	fail "dump 2 left $left bytes to d1, not all $app but the 1 MiB chunk written: $(tail -n +$((l0 + 1)) "$T/job.log" | grep saved)"
"$CLI" show "$T/d2" >"$T/show2.txt" 2>&1 || fail "show d2: $(cat "$T/show2.txt")"
grep -q "incremental: parent checkpoint $T/d1" "$T/show2.txt" || fail "show d2 names no parent"
grep -q "chunks inherited from the parent" "$T/show2.txt" || fail "show d2 lists no inherited chunks"
[ "$(grep -c '  OK$' "$T/show2.txt")" = "$n1" ] || fail "show d2 did not verify the $n1 entries: $(cat "$T/show2.txt")"
cmd 2 write 0 2
cmd 2 fresh
cmd 2 verify 2

note "dump 3: against d2, the job stops (one allocation new since d2 inherits nothing)"
pids=$(job_pids)
CUINTERPOSE_PARENT=$T/d2 criu_dump "$T/d3" || fail "criu dump 3: $(tail -5 "$T/d3/dump.log")"
wait_gone $pids || fail "dumped processes still alive"
sto=0
for f in "$T"/d3/cuinterpose-carrier-*.img; do sto=$((sto + $(stored "$f"))); done
[ "$sto" -le $((4 << 20)) ] || fail "d3: the carrier files store $sto bytes for one changed chunk and a new 2 MiB allocation"
"$CLI" show "$T/d3" >"$T/show3.txt" 2>&1 || fail "show d3: $(cat "$T/show3.txt")"
grep -q "incremental: parent checkpoint $T/d2" "$T/show3.txt" || fail "show d3 names no parent"
note "restore from d3 (chain d3 -> d2 -> d1)"
criu_restore "$T/d3" || fail "criu restore d3"
cmd 2 verify 2
[ "$(answers 2)" = "$before" ] || fail "answers differ after the restore: $(answers 2) vs $before"

note "a chain missing a link is refused, the job runs on"
mv "$T/d1" "$T/d1.moved"
CUINTERPOSE_PARENT=$T/d3 criu_dump "$T/d4" --leave-running && fail "dump against a broken chain succeeded"
grep -q "parent checkpoint $T/d1 of this incremental checkpoint is missing" "$T/d4/dump.log" ||
	fail "dump 4 does not name the missing link: $(grep -h 'Error\|refused' "$T/d4/dump.log" | tail -3)"
"$CLI" show "$T/d3" >"$T/show3.txt" 2>&1 && fail "show of a broken chain passed"
grep -q "$T/d1 of this incremental checkpoint is missing" "$T/show3.txt" || fail "show: $(cat "$T/show3.txt")"
mv "$T/d1.moved" "$T/d1"
cmd 2 verify 2
CUINTERPOSE_PARENT=$T/d5 criu_dump "$T/d5" --leave-running && fail "dump against its own directory succeeded"
grep -q "this dump's image directory is the parent checkpoint itself of its chain" "$T/d5/dump.log" ||
	fail "dump 5: $(tail -3 "$T/d5/dump.log")"
CUINTERPOSE_PARENT=$T/d3 criu_dump "$T/d1" --leave-running && fail "dump over an ancestor of its parent succeeded"
grep -q "this dump's image directory is a checkpoint of its chain" "$T/d1/dump.log" ||
	fail "dump over d1: $(tail -3 "$T/d1/dump.log")"
cmd 2 verify 2

note "a changed parent is refused at restore"
criu_dump "$T/d2" --leave-running || fail "full dump over d2"
"$CLI" show "$T/d3" >"$T/show3b.txt" 2>&1 && fail "show of d3 over a changed parent passed"
grep -q "changed parent" "$T/show3b.txt" || fail "show d3: $(cat "$T/show3b.txt")"
pids=$(job_pids)
cmd 2 exit
wait_gone $pids || fail "job did not exit"
wait_pids_free
criu_restore "$T/d3" && fail "restore over a changed parent succeeded"
grep -q "changed parent" "$T/d3/restore.log" || fail "restore: $(grep -h Error "$T/d3/restore.log" | tail -3)"
for p in $pids; do alive "$p" && fail "pid $p runs after a refused restore"; done
note done
