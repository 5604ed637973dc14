# The chunk scan is compiled before the job's pause, not inside it. The
# first load of its PTX on a machine is the driver's JIT (0.34 s on the
# H200), whose result the driver keeps in its compute cache; QUIESCE loads
# the module once while the job still runs, so that the SAVE's own load,
# behind the closed gate, finds it compiled. The fake keeps the same cache
# (here an empty CUDA_CACHE_PATH) and logs each load (FAKECUDA_JIT_LOG:
# "jit" compiled, "cached" found), a compile taking FAKECUDA_JIT_MS:
#  - first dump: the job's loads are "jit" then "cached"; the interposer
#    says it compiled before the pause; the participant's gate closed
#    after at least the compile's 1.5 s, which the plugin's pause leaves
#    out; every byte comes back;
#  - a dump of the restored job: "cached" twice, nothing compiled;
#  - CUDA_CACHE_DISABLE=1 in a job: nothing loaded before the pause (the
#    interposer says why), one "jit", the SAVE's own;
#  - the compile before the gate fails (cuModuleLoadData's next call of the
#    job, armed through FAKECUDA_FAIL_DIR): a warning, then the SAVE
#    compiles and scans on the device, and the dump and restore pass.
. "$srcdir/lib.sh"

export CUDA_CACHE_PATH=$T/cache FAKECUDA_JIT_LOG=$T/jit.log FAKECUDA_JIT_MS=1500
export FAKECUDA_FAIL_DIR=$T/faults
mkdir -p "$FAKECUDA_FAIL_DIR"

# loads PID: the job's chunk-scan loads in order, one word a load
loads() { awk -v p="$1" '$1 == "pid" && $2 == p {printf "%s%s", sep, $3; sep = " "}' "$T/jit.log"; }

note "first dump, the cache empty"
CUINTERPOSE_LOG=2 start_job 1 --private
cmd 1 verify 0
before=$(answers 1)
pid=$(pid_of 0)
: >"$T/jit.log"
pids=$(job_pids)
criu_dump "$T/d1" || fail "criu dump: $(grep Error "$T/d1/dump.log" | tail -n 3)"
wait_gone $pids || fail "dumped processes still alive"
[ "$(loads "$pid")" = "jit cached" ] ||
	fail "the job's chunk-scan loads were '$(loads "$pid")', not 'jit cached' (compiled before the gate, found by the SAVE)"
grep -q "chunk scan compiled for device 0 before the pause in" "$T/job.log" ||
	fail "the interposer does not say it compiled the scan before the pause: $(grep -i 'chunk scan' "$T/job.log" | tail -n 2)"
ms=$(sed -n "s/.*cuinterpose: pid $pid closed its gate after \([0-9]*\) ms of work with the job running.*/\1/p" "$T/d1/dump.log")
[ "${ms:-0}" -ge 1500 ] || fail "the plugin heard of ${ms:-no} ms of work before the gate, not the compile's 1500 or more"
grep -q "scanned on the device" "$T/job.log" || fail "the SAVE did not scan on the device"
criu_restore "$T/d1" || fail "criu restore"
cmd 1 verify 0
[ "$(answers 1)" = "$before" ] || fail "answers differ after the restore: $(answers 1) vs $before"

note "a dump of the restored job: the cache holds the scan"
: >"$T/jit.log"
pids=$(job_pids)
criu_dump "$T/d2" || fail "second dump: $(grep Error "$T/d2/dump.log" | tail -n 3)"
wait_gone $pids || fail "dumped processes still alive"
[ "$(loads "$pid")" = "cached cached" ] || fail "the loads of a dump with the scan cached: '$(loads "$pid")'"

note "CUDA_CACHE_DISABLE=1: nothing compiled ahead"
CUDA_CACHE_DISABLE=1 CUINTERPOSE_LOG=2 start_job 1 --private
cmd 1 verify 0
pid=$(pid_of 0)
: >"$T/jit.log"
pids=$(job_pids)
criu_dump "$T/d3" || fail "dump with the cache disabled: $(grep Error "$T/d3/dump.log" | tail -n 3)"
wait_gone $pids || fail "dumped processes still alive"
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
pids=$(job_pids)
criu_dump "$T/d4" || fail "dump after a failed compile: $(grep Error "$T/d4/dump.log" | tail -n 3)"
wait_gone $pids || fail "dumped processes still alive"
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
note done
