#!/usr/bin/env python3
"""pinrate.py - how fast pinned host staging can be had: the carrier's
threads each pin their own buffers at the start of a SAVE or LOAD, and on
the H200 that summed to 1 s over 16 threads for 256 MiB (bench-carrier).

    python3 pinrate.py [MIB_TOTAL] [THREADS...]

For each way of getting pinned memory and each thread count, every thread
gets MIB_TOTAL/THREADS MiB at once (all threads start together) and the
wall time is printed with the rate:
  hostalloc     cuMemHostAlloc(PORTABLE)
  register      mmap + cuMemHostRegister(PORTABLE) (the driver faults the pages in)
  touch+reg     mmap + write every page + cuMemHostRegister
  thp+reg       mmap + MADV_HUGEPAGE + MADV_POPULATE_WRITE + cuMemHostRegister
Prints "pinrate WAY THREADS MIB SECONDS GB/s".
"""
import ctypes
import mmap
import sys
import threading
import time

MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23
PORTABLE = 1

lib = ctypes.CDLL("libcuda.so.1")
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
lib.cuMemHostRegister_v2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
lib.cuMemHostUnregister.argtypes = [ctypes.c_void_p]
lib.cuMemFreeHost.argtypes = [ctypes.c_void_p]


def check(r, what):
    if r != 0:
        raise SystemExit("pinrate: %s: CUresult %d" % (what, r))


check(lib.cuInit(0), "cuInit")
ctx = ctypes.c_void_p()
check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")


def anon(n):
    p = libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        raise SystemExit("pinrate: mmap failed")
    return p


def get(way, n):
    check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    if way == "hostalloc":
        p = ctypes.c_void_p()
        check(lib.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), PORTABLE), "cuMemHostAlloc")
        return p.value
    p = anon(n)
    if way == "touch+reg":
        libc.memset(p, 1, n)
    elif way == "thp+reg":
        libc.madvise(p, n, MADV_HUGEPAGE)
        libc.madvise(p, n, MADV_POPULATE_WRITE)
    check(lib.cuMemHostRegister_v2(p, n, PORTABLE), "cuMemHostRegister")
    return p


def put(way, p, n):
    if way == "hostalloc":
        lib.cuMemFreeHost(p)
    else:
        lib.cuMemHostUnregister(p)
        libc.munmap(p, n)


def trial(way, threads, total):
    per = total // threads
    got = [None] * threads
    go = threading.Barrier(threads + 1)

    def work(i):
        go.wait()
        got[i] = get(way, per)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    go.wait()
    t0 = time.monotonic()
    for t in ts:
        t.join()
    dt = time.monotonic() - t0
    for p in got:
        put(way, p, per)
    return dt


def main():
    total = (int(sys.argv[1]) if len(sys.argv) > 1 else 256) << 20
    counts = [int(x) for x in sys.argv[2:]] or [1, 4, 16]
    for way in ("hostalloc", "register", "touch+reg", "thp+reg"):
        for th in counts:
            best = min(trial(way, th, total) for _ in range(2))
            print("pinrate %s %d %d %.4f %.2f" % (way, th, total >> 20, best, total / best / 1e9), flush=True)


if __name__ == "__main__":
    main()
