# A job migrated between two simulated hosts (the fake driver: machine A,
# then machine B with two other GPUs), as README's migration recipe does:
# - while the job runs on A, `cuinterpose precopy` copies its device
#   memory; the job then writes;
# - the final dump names the pre-copy as its parent (only the chunk written
#   since is saved) and sends criu's memory pages to host B's page server
#   over loopback, into B's fresh image directory;
# - the rest of the images and the pre-copy are copied to B beside it and
#   A's copies are deleted;
# - on machine B (other GPU UUIDs) the restore pairs the GPUs with
#   CUINTERPOSE_GPU_REMAP=auto; every byte, address, the last write and the
#   sharing (a write by each rank seen by every rank) are checked.
. "$srcdir/lib.sh"

N=2
export FAKECUDA_DEVICES=2 FAKECUDA_UUID_SEED=41
CLI=$B/cli/cuinterpose

stop_page_server() { [ -s "$T/ps.pid" ] && kill "$(cat "$T/ps.pid")" 2>/dev/null; rm -f "$T/ps.pid"; }

start_job $N
GEN=0
cmd $N verify $GEN
before=$(answers $N)
pids=$(job_pids)
A=$(uuids)

note "host A ($A): live pre-copy, then the job writes"
mkdir -p "$T/a" "$T/b/d"
"$CLI" precopy "$JOBPID" "$T/a/pre" >"$T/pre.out" 2>&1 || fail "precopy: $(cat "$T/pre.out")"
GEN=1
cmd $N write $((N - 1)) $GEN
cmd $N verify $GEN

note "host B's page server; the final dump against the pre-copy"
port=$((20000 + $$ % 20000))
bounded "$CRIU" page-server -D "$T/b/d" --address 127.0.0.1 --port $port -d --pidfile "$T/ps.pid" -v4 \
	-o page-server.log || fail "criu page-server: $(tail -3 "$T/b/d/page-server.log")"
CUINTERPOSE_PARENT=$T/a/pre criu_dump "$T/a/d" --page-server --address 127.0.0.1 --port $port ||
	{ stop_page_server; fail "criu dump to the page server: $(grep -h Error "$T/a/d/dump.log" | tail -3)"; }
wait_gone $pids || fail "the dumped job did not exit"
for _ in $(seq 200); do [ -s "$T/ps.pid" ] && alive "$(cat "$T/ps.pid")" || break; nap 0.05; done
stop_page_server
grep -q "SAVE: [0-9]* of [0-9]* carried bytes left to the parent checkpoint $T/a/pre, 1048576 written" "$T/a/d/dump.log" ||
	fail "the final dump wrote more than the changed chunk: $(grep 'left to the parent' "$T/a/d/dump.log")"
ls "$T"/b/d/pages-*.img >/dev/null 2>&1 || fail "no memory pages reached host B's page server"
ls "$T"/a/d/pages-*.img >/dev/null 2>&1 && fail "memory pages were written on host A"

note "the images to host B, A's copies deleted"
cp -an "$T/a/d/." "$T/b/d/" && cp -a "$T/a/pre" "$T/b/pre" || fail "cannot copy the images to B"
rm -rf "$T/a"
machine 42
Bm=$(uuids)
[ "$Bm" != "$A" ] || fail "machine B has the same UUIDs: $Bm"

note "restore on host B ($Bm) with CUINTERPOSE_GPU_REMAP=auto"
CUINTERPOSE_GPU_REMAP=auto criu_restore "$T/b/d" || fail "criu restore on B: $(grep -h Error "$T/b/d/restore.log" | tail -3)"
for u in $Bm; do
	grep -q "CUINTERPOSE_GPU_REMAP=auto: GPU GPU-[0-9a-f-]* of the images restores onto $u" "$T/b/d/restore.log" ||
		fail "auto's pair onto $u not logged"
done
cmd $N verify $GEN
[ "$(answers $N)" = "$before" ] || fail "addresses changed: $(answers $N) (was $before)"
writes_reach_everyone
cmd $N exit
note done
