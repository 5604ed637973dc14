# A participant holding a POSIX semaphore as Python's multiprocessing makes
# them under spawn (mapped under a /dev/shm name that is gone, the file
# living on as sem.NAME): without --link-remap criu cannot dump it, the
# plugin's dump.log line names the process and the file and points at the
# README recipe, the job keeps running, and `cuinterpose check --pid` says
# the same; with --link-remap the dump and the restore pass.
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

CLI=$B/plugin/cuinterpose
start_proc 3 --sem
R0=$(rank_pid 0)
trap 'rm -f /dev/shm/sem.cuip-e2e-'"$R0"'; cleanup' EXIT
grep -q "/dev/shm/.* (deleted)" /proc/$R0/maps || skip "this libc's sem_open leaves no unlinked /dev/shm mapping"
cmd 3 verify 0
note "without --link-remap"
criu_dump "$T/d1" && fail "criu dumped a semaphore's unlinked path without --link-remap"
has_line "$T/d1/dump.log" "Use link-remap option" "criu failed for another reason"
has_line "$T/d1/dump.log" "cuinterpose: pid $R0 \(e2e_proc\) maps or holds 1 unlinked /dev/shm file\(s\) \(/dev/shm/.*\): criu dump needs --link-remap; see the README section \"PyTorch and torch.multiprocessing jobs\"" \
	"no hint at --link-remap"
for p in $(job_pids); do alive $p || fail "pid $p died"; done
cmd 3 verify 0
"$CLI" check --no-processes --pid "$R0" >"$T/check.out" 2>&1
has_line "$T/check.out" "^WARN +pid $R0 .*unlinked /dev/shm.*--link-remap.*PyTorch and torch.multiprocessing jobs" \
	"cuinterpose check does not point at the recipe"
note "with --link-remap"
# Measured in the ASan build (2 of 3 runs): criu's own link remap of the
# semaphore fails "Can't link remap to /dev/shm/sem.XXXX: File exists" before
# any plugin hook is involved; the plain build passes every time.
[ -n "${CUIP_ASAN_RT:-}" ] &&
	skip "ASan build: criu's link remap of the semaphore fails 'File exists' (CRIU, not the plugin); the hint part passed"
criu_dump "$T/d2" --link-remap || fail "criu dump --link-remap"
grep -q "criu dump needs --link-remap" "$T/d2/dump.log" && fail "warned although --link-remap was given"
wait_gone $(job_pids) || fail "the dumped job did not exit"
criu_restore "$T/d2" || fail "criu restore"
cmd 3 write 0 2
cmd 3 verify 2
cmd 3 exit
note done
