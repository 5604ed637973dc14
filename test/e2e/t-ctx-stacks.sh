# The contexts' stack reservations around the native checkpoint: a CUDA
# context reserves device memory for every thread's stack
# (CU_LIMIT_STACK_SIZE each; 264 MiB of an H200 context, FACTS), which
# NVIDIA's native checkpoint copies into the process and CRIU then dumps.
# The interposer lowers every context's stack limit at PREPARE_UNICAST and
# sets each one's own value back at RESUME. With e2e_group --private (rank
# 0 sets 2048 bytes per thread, rank 1 keeps the driver's default 1024;
# verify checks them):
#  - the fake's native checkpoint (FAKECUDA_CKPT_LOG) copies no stacks (the
#    limits are 0 bytes per thread then), and after the restore both limits
#    are back, through two cycles and a --leave-running dump;
#  - CUINTERPOSE_TEST_STACKS=keep leaves them: 2048 and 1024 bytes per thread are
#    copied; another value makes the job's first cuInit fail naming it;
#  - a cuCtxSetLimit that fails while lowering is reported on the job's
#    stderr, that process's stacks go whole, and the dump and restore pass;
#    one that fails while setting the limit back is reported and the job
#    runs on with the lowered limit (the driver raises it per launch).
. "$srcdir/lib.sh"
export FAKECUDA_FAIL_DIR=$T/faults
export FAKECUDA_CKPT_LOG=$T/native.log
mkdir -p "$FAKECUDA_FAIL_DIR"
WORKLOAD=$B/test/e2e/e2e_group
[ -x "$WORKLOAD" ] || skip "workload not built"
N=2
THREADS=1024 # FK_STACK_THREADS

# stacks_of PID: the context-stack bytes of PID's last native checkpoint.
stacks_of() {
	awk -v p="$1" '$1 == "pid" && $2 == p {s = $12} END {print s}' "$T/native.log"
}

# cycle NAME LOW0 LOW1 [criu dump args]: dump (native stacks of rank 0 and
# rank 1 must be LOW0 and LOW1 bytes per thread), restore unless
# --leave-running, verify.
cycle() {
	local name=$1 s0=$2 s1=$3 r0 r1
	shift 3
	r0=$(pid_of 0)
	r1=$(pid_of 1)
	rm -f "$T/native.log"
	criu_dump "$T/$name" "$@" || fail "criu dump ($name)"
	[ "$(stacks_of "$r0")" = $((s0 * THREADS)) ] ||
		fail "$name: rank 0's native checkpoint copied $(stacks_of "$r0") bytes of stacks, not $s0 x $THREADS: $(cat "$T/native.log")"
	[ "$(stacks_of "$r1")" = $((s1 * THREADS)) ] ||
		fail "$name: rank 1's native checkpoint copied $(stacks_of "$r1") bytes of stacks, not $s1 x $THREADS: $(cat "$T/native.log")"
	case " $* " in
	*" --leave-running "*) ;;
	*)
		wait_gone $(job_pids) || fail "$name: dumped processes still alive"
		criu_restore "$T/$name" || fail "criu restore ($name)"
		;;
	esac
	cmd $N verify 0
	[ "$(answers $N)" = "$before" ] || fail "$name: addresses changed"
}

note "lowered: two cycles, then --leave-running"
start_job $N --private
cmd $N verify 0
before=$(answers $N)
cycle c1 0 0
cycle c2 0 0
cycle lr 0 0 --leave-running
grep -q "in-place restore complete" "$T/lr/dump.log" || fail "no in-place restore"

note "a failing cuCtxSetLimit while lowering: reported, the dump passes"
arm "$(pid_of 0)" cuCtxSetLimit:1
cycle f1 2048 0
disarm
grep -q "cuinterpose\[$JOBPID\]: lowering the stack limit of device 0's primary context failed: unknown error; the native checkpoint copies the stacks too" "$T/job.log" ||
	fail "no message for the failed lowering: $(grep -i stack "$T/job.log")"

note "a failing cuCtxSetLimit while setting a limit back: reported, the job runs"
pids=$(job_pids)
rm -f "$T/native.log"
criu_dump "$T/f2" || fail "criu dump (f2)"
wait_gone $pids || fail "f2: dumped processes still alive"
arm "$(pid_of 0)" cuCtxSetLimit:1 # the restored rank 0 keeps its pid
criu_restore "$T/f2" || fail "criu restore (f2)"
disarm
grep -q "cuinterpose\[$JOBPID\]: context 0x[0-9a-f]*: setting its stack limit back to 2048 bytes failed: unknown error (kernels still get theirs at launch)" "$T/job.log" ||
	fail "no message for the failed setting back: $(grep -i stack "$T/job.log")"
# verify answers per rank: rank 0 runs with the lowered limit, rank 1 has its own
cmd_sent $N verify 0
[ "$(sed -n 1p <<<"$(answers $N)")" = "fail stack limit 0 bytes per thread, not the 2048 it had at start" ] ||
	fail "rank 0 after the failed setting back: $(answers $N)"
case "$(sed -n 2p <<<"$(answers $N)")" in ok*) ;; *) fail "rank 1: $(answers $N)" ;; esac
cmd $N exit
wait_gone $(job_pids) || fail "job did not exit"

note "CUINTERPOSE_TEST_STACKS=keep"
export CUINTERPOSE_TEST_STACKS=keep
start_job $N --private
cmd $N verify 0
before=$(answers $N)
cycle k1 2048 1024
cmd $N exit
wait_gone $(job_pids) || fail "job did not exit"

note "CUINTERPOSE_TEST_STACKS=bogus: cuInit fails naming it"
job_refused CUINTERPOSE_TEST_STACKS=bogus
grep -q "cuinterpose: pid [0-9]*: CUINTERPOSE_TEST_STACKS=bogus: want lower|keep; cuInit fails (nothing has changed)" \
	"$T/refused.log" || fail "no message for CUINTERPOSE_TEST_STACKS=bogus: $(cat "$T/refused.log")"
note done
