#!/usr/bin/env python3
"""ctxrss.py - where NVIDIA's native checkpoint puts a CUDA context's own
device memory, and whether the context's limits change how much.

    python3 ctxrss.py [bare|torch] [keep|shrink|all]

Starts a target process that creates one CUDA context (bare: the driver API
through ctypes, one kernel-free context; torch: PyTorch with one small kernel
run) and then, with "shrink", lowers the context's stack size limit
(cuCtxSetLimit, asking 0) before the checkpoint; "all" asks 0 of the stack,
printf FIFO, malloc heap and the device runtime's sync depth and pending
launch count, and reports what the driver made of each and the device memory
the context holds after it. This process
then locks and checkpoints the target through cuCheckpointProcess*, reads its
VmRSS before, during and after and the native steps' times, restores and
unlocks it, and the target sets its limit back and runs a kernel again (torch) to show the context works.

Prints one line per reading: "ctxrss MODE LIMITS KEY VALUE".
"""
import ctypes
import os
import subprocess
import sys
import time

LIMITS = {0: "stack", 1: "printf", 2: "heap"}
# the device runtime's (CUDA dynamic parallelism) limits: reported, and
# lowered in "all", to see whether they hold any of the context's memory
CDP_LIMITS = {3: "cdp_sync_depth", 4: "cdp_pending_launches"}


def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    return lib


def check(r, what):
    if r != 0:
        raise SystemExit("ctxrss: %s failed: CUresult %d" % (what, r))


def mem_used(lib):
    free = ctypes.c_size_t()
    total = ctypes.c_size_t()
    check(lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return (total.value - free.value) >> 20


def get_limit(lib, k):
    v = ctypes.c_size_t()
    check(lib.cuCtxGetLimit(ctypes.byref(v), k), "cuCtxGetLimit")
    return v.value


def limit_or_rc(lib, k):
    """The limit, or "rc N" where the driver refuses it (the H200's driver
    answers CUDA_ERROR_UNSUPPORTED_LIMIT (215) for the device runtime's sync
    depth, in bare and PyTorch contexts alike)."""
    v = ctypes.c_size_t()
    r = lib.cuCtxGetLimit(ctypes.byref(v), k)
    return str(v.value) if r == 0 else "rc %d" % r


def target(mode, limits):
    lib = cuda()
    if mode == "torch":
        import torch
        x = torch.ones(1 << 20, device="cuda")
        y = (x * 2).sum().item()
        assert y == 2 * (1 << 20)
    else:
        check(lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
        check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    saved = {k: get_limit(lib, k) for k in LIMITS}
    print("used_mib_before %d" % mem_used(lib), flush=True)
    for k, n in {**LIMITS, **CDP_LIMITS}.items():
        print("limit_%s %s" % (n, limit_or_rc(lib, k)), flush=True)
    if limits == "all":
        # every limit to 0: the driver's minimums, and which it refuses (the
        # printf FIFO once a kernel with printf ran), with the device memory
        # the context holds after each; only the stack is set back afterwards
        for k, n in {**LIMITS, **CDP_LIMITS}.items():
            print("setlimit_%s_rc %d" % (n, lib.cuCtxSetLimit(k, ctypes.c_size_t(0))), flush=True)
            print("limit_%s_now %s" % (n, limit_or_rc(lib, k)), flush=True)
            print("used_mib_after_%s %d" % (n, mem_used(lib)), flush=True)
    if limits == "shrink":
        # the stack only (it holds nothing between kernels); asking 0 shows
        # the driver's minimum
        t0 = time.monotonic()
        r = lib.cuCtxSetLimit(0, ctypes.c_size_t(0))
        print("setlimit_stack_rc %d" % r, flush=True)
        print("setlimit_stack_s %.4f" % (time.monotonic() - t0), flush=True)
        print("limit_stack_now %d" % get_limit(lib, 0), flush=True)
    print("used_mib_ready %d" % mem_used(lib), flush=True)
    print("ready", flush=True)
    sys.stdin.readline()
    if limits in ("shrink", "all"):
        t0 = time.monotonic()
        check(lib.cuCtxSetLimit(0, ctypes.c_size_t(saved[0])), "cuCtxSetLimit back")
        print("setlimit_back_s %.4f" % (time.monotonic() - t0), flush=True)
        print("limit_stack_back %d" % get_limit(lib, 0), flush=True)
    if mode == "torch":
        import torch
        x = torch.ones(1 << 20, device="cuda")
        ok = (x * 3).sum().item() == 3 * (1 << 20)
        print("kernel_after %s" % ("ok" if ok else "WRONG"), flush=True)
    print("used_mib_after %d" % mem_used(lib), flush=True)
    print("done", flush=True)


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) >> 10
    return -1


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "bare"
    limits = sys.argv[2] if len(sys.argv) > 2 else "keep"
    if os.environ.get("CTXRSS_TARGET"):
        return target(mode, limits)
    env = dict(os.environ, CTXRSS_TARGET="1")
    p = subprocess.Popen([sys.executable, __file__, mode, limits], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def out(k, v):
        print("ctxrss %s %s %s %s" % (mode, limits, k, v), flush=True)

    for line in p.stdout:
        line = line.strip()
        if line == "ready":
            break
        out(*line.split(" ", 1))
    else:
        raise SystemExit("ctxrss: target ended early (rc %s)" % p.wait())
    lib = cuda()
    check(lib.cuInit(0), "cuInit (checkpointer)")
    pid = p.pid
    out("rss_mib_running", rss_mib(pid))
    check(lib.cuCheckpointProcessLock(pid, None), "lock")
    t0 = time.monotonic()
    check(lib.cuCheckpointProcessCheckpoint(pid, None), "checkpoint")
    out("checkpoint_s", "%.4f" % (time.monotonic() - t0))
    out("rss_mib_checkpointed", rss_mib(pid))
    t0 = time.monotonic()
    check(lib.cuCheckpointProcessRestore(pid, None), "restore")
    out("restore_s", "%.4f" % (time.monotonic() - t0))
    check(lib.cuCheckpointProcessUnlock(pid, None), "unlock")
    out("rss_mib_restored", rss_mib(pid))
    p.stdin.write("go\n")
    p.stdin.flush()
    for line in p.stdout:
        line = line.strip()
        if line == "done":
            break
        out(*line.split(" ", 1))
    out("rc", p.wait())


if __name__ == "__main__":
    main()
