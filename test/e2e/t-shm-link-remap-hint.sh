# A participant holding a POSIX semaphore as Python's multiprocessing makes
# them under spawn (mapped under a /dev/shm name that is gone, the file
# living on as sem.NAME): without --link-remap criu cannot dump it, the
# plugin's dump.log line names the process and the file and points at the
# README recipe, the job keeps running, and `cuinterpose check --pid` says
# the same. With --link-remap: links left in /dev/shm by an earlier dump
# whose images were never restored here make criu fail "File exists" when
# its new link takes one of their names; the plugin warns before that
# happens (and check does), the job keeps running, and once they are gone
# the dump and the restore pass.
. "$srcdir/lib.sh"
. "$srcdir/lib-proc.sh"

CLI=$B/cli/cuinterpose
start_proc 3 --sem
R0=$(rank_pid 0)
# link_remap.N names this test plants (criu numbers its links from a small
# per-dump counter: 1..1024 covers every number this job's dump can take).
plant() { for i in $(seq 1 1024); do : >"/dev/shm/link_remap.$i" || return 1; done; }
unplant() { for i in $(seq 1 1024); do rm -f "/dev/shm/link_remap.$i"; done; }
at_exit 'rm -f /dev/shm/sem.cuip-e2e-'"$R0"'; unplant'
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
note "with --link-remap and links left by an earlier dump"
# Links of another run would collide the same way: the outcome would not be
# this test's to decide.
ls /dev/shm/link_remap.* >/dev/null 2>&1 &&
	skip "/dev/shm holds link_remap files this test did not make ($(ls /dev/shm/link_remap.* | head -3 | tr '\n' ' '))"
plant || fail "cannot plant link_remap files in /dev/shm"
"$CLI" check --no-processes --pid "$R0" >"$T/check2.out" 2>&1
has_line "$T/check2.out" "^WARN +pid $R0 .*1024 link_remap file\(s\) in its /dev/shm .*File exists" \
	"cuinterpose check does not warn about the leftover links"
criu_dump "$T/d2" --link-remap && fail "criu dumped although its link remap name was taken"
has_line "$T/d2/dump.log" "Can't link remap to /dev/shm/.*: File exists" "criu failed for another reason"
has_line "$T/d2/dump.log" "cuinterpose: pid $R0 \(e2e_proc\): 1024 link_remap file\(s\) already in its /dev/shm \(/dev/shm/link_remap\.[0-9]+\), left by an earlier criu dump --link-remap" \
	"no warning about the leftover links"
for p in $(job_pids); do alive $p || fail "pid $p died"; done
cmd 3 verify 0
unplant
note "with --link-remap"
criu_dump "$T/d3" --link-remap || fail "criu dump --link-remap"
grep -q "criu dump needs --link-remap\|link_remap file(s) already" "$T/d3/dump.log" &&
	fail "warned although --link-remap was given and /dev/shm is clean"
ls /dev/shm/link_remap.* >/dev/null 2>&1 || fail "criu made no link remap"
wait_gone $(job_pids) || fail "the dumped job did not exit"
criu_restore "$T/d3" || fail "criu restore"
ls /dev/shm/link_remap.* >/dev/null 2>&1 && fail "the restore left its link remap in /dev/shm"
cmd 3 write 0 2
cmd 3 verify 2
cmd 3 exit
note done
