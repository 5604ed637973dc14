# The chunk scan is compiled before the job's pause, not inside it. The
# first load of its PTX on a machine is the driver's JIT (0.34 s on the
# H200), whose result the driver keeps in its compute cache; QUIESCE has
# the module loaded once while the job still runs (on a worker it waits for
# at most half of what is left of its timeout), so that the SAVE's own
# load, behind the closed gate, finds it compiled. The fake keeps the same
# cache where CUDA_CACHE_PATH says (empty at first here) and logs each load
# (FAKECUDA_JIT_LOG: "jit" compiled, "cached" found), a compile taking
# FAKECUDA_JIT_MS:
#  - first dump (a 4 s compile, QUIESCE's timeout 20 s: a budget of some
#    10 s, far from the compile's end on a loaded machine): the job's
#    loads are "jit" then "cached";
#    the interposer says it compiled before the pause; the participant
#    told the plugin of 4 s or more of work before its gate, and the pause
#    line leaves them out (held exceeds frozen by less than 4 s; counted
#    from the QUIESCE request, held would exceed it by 4 s or more);
#    every byte comes back;
#  - a dump of the restored job: "cached" twice, nothing compiled;
#  - CUDA_CACHE_DISABLE=1 in a job: nothing loaded before the pause (the
#    interposer says why), one "jit", the SAVE's own;
#  - the compile before the gate fails (cuModuleLoadData's next call of the
#    job, armed through FAKECUDA_FAIL_DIR): a warning, then the SAVE
#    compiles and scans on the device, and the dump and restore pass;
#  - a compile slower than its budget (3 s against a QUIESCE timeout of
#    2 s): the gate closes without it, after less than the compile's 3 s,
#    with a warning, and the dump and restore pass.
. "$srcdir/lib.sh"

export CUDA_CACHE_PATH=$T/cache FAKECUDA_JIT_LOG=$T/jit.log
export FAKECUDA_FAIL_DIR=$T/faults
mkdir -p "$FAKECUDA_FAIL_DIR"

# loads PID: the job's chunk-scan loads in order, one word a load
loads() { awk -v p="$1" '$1 == "pid" && $2 == p {printf "%s%s", sep, $3; sep = " "}' "$T/jit.log"; }
# gate_ms DIR PID: the ms PID worked before its gate closed, as the plugin heard
gate_ms() {
	sed -n "s/.*cuinterpose: pid $2 closed its gate after \([0-9]*\) ms of work with the job running.*/\1/p" \
		"$1/dump.log" | tail -n 1
}
# dump_gone NAME: dump the job into $T/NAME; its processes gone
dump_gone() {
	pids=$(job_pids)
	criu_dump "$T/$1" || fail "criu dump: $(grep Error "$T/$1/dump.log" | tail -n 3)"
	wait_gone $pids || fail "dumped processes still alive"
}

note "first dump, the cache empty, a 4 s compile"
FAKECUDA_JIT_MS=4000 CUINTERPOSE_LOG=2 start_job 1 --private
cmd 1 verify 0
before=$(answers 1)
pid=$(pid_of 0)
: >"$T/jit.log"
CUINTERPOSE_QUIESCE_TIMEOUT_MS=20000 dump_gone d1
[ "$(loads "$pid")" = "jit cached" ] ||
	fail "the job's chunk-scan loads were '$(loads "$pid")', not 'jit cached' (compiled before the gate, found by the SAVE)"
grep -q "chunk scan compiled for device 0 before the pause in" "$T/job.log" ||
	fail "the interposer does not say it compiled the scan before the pause: $(grep -i 'chunk scan' "$T/job.log" | tail -n 2)"
ms=$(gate_ms "$T/d1" "$pid")
[ "${ms:-0}" -ge 4000 ] || fail "the plugin heard of ${ms:-no} ms of work before the gate, not the compile's 4000 or more"
read -r held frozen < <(sed -n 's/.*cuinterpose: pause: CUDA calls held \([0-9.]*\) s, threads frozen \([0-9.]*\) s.*/\1 \2/p' \
	"$T/d1/dump.log" | tail -n 1)
[ -n "$held" ] || fail "no pause line in the dump's log"
awk -v h="$held" -v f="$frozen" 'BEGIN {exit !(h - f < 4.0)}' ||
	fail "the pause counts the compile: CUDA calls held $held s, threads frozen $frozen s"
grep -q "scanned on the device" "$T/job.log" || fail "the SAVE did not scan on the device"
criu_restore "$T/d1" || fail "criu restore"
cmd 1 verify 0
[ "$(answers 1)" = "$before" ] || fail "answers differ after the restore: $(answers 1) vs $before"

note "a dump of the restored job: the cache holds the scan"
: >"$T/jit.log"
dump_gone d2
[ "$(loads "$pid")" = "cached cached" ] || fail "the loads of a dump with the scan cached: '$(loads "$pid")'"

note "CUDA_CACHE_DISABLE=1: nothing compiled ahead"
CUDA_CACHE_DISABLE=1 CUINTERPOSE_LOG=2 start_job 1 --private
cmd 1 verify 0
pid=$(pid_of 0)
: >"$T/jit.log"
dump_gone d3
[ "$(loads "$pid")" = "jit" ] || fail "the loads with the cache disabled: '$(loads "$pid")', not the SAVE's one 'jit'"
grep -q "the chunk scan is not compiled before the pause: CUDA_CACHE_DISABLE=1" "$T/job.log" ||
	fail "the interposer does not say why it compiled nothing: $(grep -i 'chunk scan' "$T/job.log" | tail -n 2)"

note "the compile before the gate fails: the SAVE compiles"
rm -rf "$CUDA_CACHE_PATH"
CUINTERPOSE_LOG=2 start_job 1 --private
cmd 1 verify 0
before=$(answers 1)
pid=$(pid_of 0)
arm "$pid" cuModuleLoadData:1:CUDA_ERROR_OUT_OF_MEMORY
: >"$T/jit.log"
dump_gone d4
disarm
grep -q "the chunk scan is not compiled before the pause on device 0: cuModuleLoadData of the chunk-scan PTX failed: CUDA_ERROR_OUT_OF_MEMORY" \
	"$T/job.log" || fail "no warning of the failed compile: $(grep -i 'chunk scan' "$T/job.log" | tail -n 2)"
[ "$(loads "$pid")" = "jit" ] || fail "the loads after a failed compile: '$(loads "$pid")', not the SAVE's 'jit'"
grep -q "scanned on the device" "$T/job.log" || fail "the SAVE did not scan on the device after the failed compile"
criu_restore "$T/d4" || fail "restore after a failed compile"
cmd 1 verify 0
[ "$(answers 1)" = "$before" ] || fail "answers differ after the restore: $(answers 1) vs $before"
cmd 1 exit
wait_gone $(job_pids) || fail "the restored job did not exit"

note "a compile slower than its budget: the gate closes without it"
rm -rf "$CUDA_CACHE_PATH"
FAKECUDA_JIT_MS=3000 CUINTERPOSE_LOG=2 start_job 1 --private
cmd 1 verify 0
before=$(answers 1)
pid=$(pid_of 0)
pids=$(job_pids)
CUINTERPOSE_QUIESCE_TIMEOUT_MS=2000 criu_dump "$T/d5" || fail "dump with a slow compile: $(grep Error "$T/d5/dump.log" | tail -n 3)"
wait_gone $pids || fail "dumped processes still alive"
grep -Eq "the chunk scan's compile took more than [0-9]+ ms: the gate closes without it" "$T/job.log" ||
	fail "no warning of the late compile: $(grep -i 'chunk scan' "$T/job.log" | tail -n 2)"
ms=$(gate_ms "$T/d5" "$pid")
[ -n "$ms" ] && [ "$ms" -lt 3000 ] || fail "the gate closed after ${ms:-no} ms, not before the 3 s compile ended"
criu_restore "$T/d5" || fail "restore after a late compile"
cmd 1 verify 0
[ "$(answers 1)" = "$before" ] || fail "answers differ after the restore: $(answers 1) vs $before"
cmd 1 exit
wait_gone $(job_pids) || fail "the restored job did not exit"
note done
