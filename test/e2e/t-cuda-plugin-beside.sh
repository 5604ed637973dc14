# One owner of the CUDA transitions: CRIU's own cuda_plugin.so in the same
# plugin directory as ours (criu loads every plugin there, and both would
# lock and checkpoint the same processes) is refused when criu starts, the
# dump and the restore alike, naming the file; the job keeps running with
# every byte and address; with the directory fixed the same job dumps and
# restores.
. "$srcdir/lib.sh"

base=${CUINTERPOSE_BASELINE_PLUGIN:-/usr/local/lib/cuinterpose/baseline/cuda_plugin.so}
[ -f "$base" ] || fail "no CRIU cuda_plugin.so at $base (contrib/install-deps.sh installs it)"
cp "$base" "$T/plugins/cuda_plugin.so"

start_job 2
cmd 2 verify 0
before=$(answers 2)
pids=$(job_pids)
note "dump with cuda_plugin.so beside"
criu_dump "$T/d" && fail "criu dump succeeded with cuda_plugin.so beside ours"
grep -q "cuinterpose: CRIU's cuda_plugin is loaded beside cuinterpose ($T/plugins/cuda_plugin.so)" "$T/d/dump.log" ||
	fail "dump.log does not name cuda_plugin.so: $(grep -E 'Error|cuinterpose' "$T/d/dump.log" | head -n 3)"
grep -q "PAUSE_DEVICES done" "$T/d/dump.log" && fail "the plugin paused the job anyway"
for p in $pids; do alive "$p" || fail "pid $p died"; done
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "answers changed after the refused dump: $(answers 2) vs $before"

note "dump and restore with only cuinterpose"
rm "$T/plugins/cuda_plugin.so"
rm -rf "$T/d"
criu_dump "$T/d" || fail "criu dump without cuda_plugin.so"
wait_gone $pids || fail "dumped processes still alive"
note "restore with cuda_plugin.so beside"
cp "$base" "$T/plugins/cuda_plugin.so"
criu_restore "$T/d" && fail "criu restore succeeded with cuda_plugin.so beside ours"
grep -q "cuinterpose: CRIU's cuda_plugin is loaded beside cuinterpose ($T/plugins/cuda_plugin.so)" "$T/d/restore.log" ||
	fail "restore.log does not name cuda_plugin.so: $(grep -E 'Error|cuinterpose' "$T/d/restore.log" | head -n 3)"
wait_gone $pids || fail "processes of the refused restore alive"
note "restore with only cuinterpose"
rm "$T/plugins/cuda_plugin.so"
criu_restore "$T/d" || fail "criu restore without cuda_plugin.so"
cmd 2 verify 0
[ "$(answers 2)" = "$before" ] || fail "answers changed after restore: $(answers 2) vs $before"
cmd 2 exit
note done
