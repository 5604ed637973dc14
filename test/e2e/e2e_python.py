#!/usr/bin/env python3
"""e2e_python.py - a Python job for t-release-python.sh: the release hooks
CUINTERPOSE_RELEASE=python:STATEMENT runs inside a real interpreter.

    e2e_python.py DIR

Through ctypes on libcuda.so.1 (the fake driver under fakecuda-run, reached
through the preloaded interposer's dlsym) it creates a context, a LIVE
buffer of 2 MiB with a byte pattern and a CACHE of 32 MiB, as a framework's
caching allocator keeps. release() (for CUINTERPOSE_RELEASE=python:release())
frees the cache; broken() raises. It writes DIR/r0.ready ("pid <pid>") and
answers the e2e protocol's commands (lib.sh's cmd) in DIR/r0.<seq>:

  verify   the live buffer still holds its pattern, at the same address;
           a released cache is allocated again (and must read zero)
  exit     leave
"""
import ctypes
import os
import sys
import time

MIB = 1 << 20
LIVE = 2 * MIB
CACHE = 32 * MIB

cu = ctypes.CDLL("libcuda.so.1")
CUdeviceptr = ctypes.c_uint64


def ck(r, what):
    if r != 0:
        raise RuntimeError("%s: CUresult %d" % (what, r))


ck(cu.cuInit(0), "cuInit")
dev = ctypes.c_int()
ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ctx = ctypes.c_void_p()
ck(cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")

live = CUdeviceptr()
ck(cu.cuMemAlloc_v2(ctypes.byref(live), ctypes.c_size_t(LIVE)), "cuMemAlloc(live)")
pattern = bytes((i * 7 + 3) & 0xFF for i in range(LIVE))
ck(cu.cuMemcpyHtoD_v2(live, pattern, ctypes.c_size_t(LIVE)), "cuMemcpyHtoD(live)")
cache = CUdeviceptr()
ck(cu.cuMemAlloc_v2(ctypes.byref(cache), ctypes.c_size_t(CACHE)), "cuMemAlloc(cache)")


def release():
    """What CUINTERPOSE_RELEASE=python:release() runs, on the interposer's thread."""
    if cache.value:
        ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent(release)")
        ck(cu.cuMemFree_v2(cache), "cuMemFree(cache)")
        cache.value = 0


def broken():
    raise ValueError("a release hook that fails")


def verify():
    buf = ctypes.create_string_buffer(LIVE)
    ck(cu.cuMemcpyDtoH_v2(buf, live, ctypes.c_size_t(LIVE)), "cuMemcpyDtoH(live)")
    if buf.raw != pattern:
        first = next(i for i in range(LIVE) if buf.raw[i] != pattern[i])
        return "fail live buffer: byte %d is %#x, not %#x" % (first, buf.raw[first], pattern[first])
    if not cache.value:
        ck(cu.cuMemAlloc_v2(ctypes.byref(cache), ctypes.c_size_t(CACHE)), "cuMemAlloc(cache again)")
        z = ctypes.create_string_buffer(CACHE)
        ck(cu.cuMemcpyDtoH_v2(z, cache, ctypes.c_size_t(CACHE)), "cuMemcpyDtoH(cache)")
        if z.raw.count(0) != CACHE:
            return "fail the cache allocated again does not read zero"
    return "ok live %x" % live.value


def answer(d, seq, text):
    tmp = os.path.join(d, "r0.%s.tmp" % seq)
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.rename(tmp, os.path.join(d, "r0.%s" % seq))


def main():
    d = sys.argv[1]
    with open(os.path.join(d, "r0.ready.tmp"), "w") as f:
        f.write("pid %d\n" % os.getpid())
    os.rename(os.path.join(d, "r0.ready.tmp"), os.path.join(d, "r0.ready"))
    seen = 0
    while True:
        try:
            with open(os.path.join(d, "cmd")) as f:
                words = f.read().split()
        except FileNotFoundError:
            words = []
        if len(words) >= 2 and int(words[0]) > seen:
            seen = int(words[0])
            if words[1] == "exit":
                answer(d, seen, "ok")
                return 0
            try:
                text = verify() if words[1] == "verify" else "fail unknown command %s" % words[1]
            except Exception as e:  # the test reads the reason
                text = "fail %s" % e
            answer(d, seen, text)
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
