#!/usr/bin/env python3
"""plainio.py - the best plain parallel write and read into a directory, the
baseline the carrier's SAVE and LOAD rates are held against (test/gpu/bench.sh).

    plainio.py DIR BYTES THREADS [THREADS...]

For each thread count N: N threads each pwrite() their share of BYTES into a
file of their own in DIR (8 MiB blocks from one buffer, page cache, no fsync:
as the carrier writes), then N threads pread() them back; the files are
removed after each N. Prints one line per N and then
"best write W GB/s (N threads) read R GB/s (M threads)". os.pwrite and
os.preadv release the GIL, so the threads run in parallel. PLAINIO_DIRECT=1
opens the files O_DIRECT (page-aligned buffers, no page cache): the disk's
own rate, the other way the carrier could write. PLAINIO_COLD=1 measures
what storage gives a node after a reboot: each writer fsync()s its file
inside the timed write (the bytes are durable when it ends), and the page
cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches, root) before
the timed read.
"""
import mmap
import os
import sys
import threading
import time

BLOCK = 8 << 20
DIRECT = os.environ.get("PLAINIO_DIRECT") == "1"
COLD = os.environ.get("PLAINIO_COLD") == "1"


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def run(d, total, n, write):
    per = (total // n + BLOCK - 1) // BLOCK * BLOCK
    paths = [os.path.join(d, "plainio-%d-%d.tmp" % (os.getpid(), i)) for i in range(n)]
    errs = []

    def one(i):
        try:
            left = max(0, min(per, total - i * per))
            buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
            if write:
                buf[:] = bytes(range(256)) * (BLOCK // 256)
            mv = memoryview(buf)
            flags = (os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if write else os.O_RDONLY
            fd = os.open(paths[i], flags | (os.O_DIRECT if DIRECT else 0), 0o600)
            off = 0
            while off < left:
                ln = min(BLOCK, left - off)
                if write:
                    got = os.pwrite(fd, mv[:ln], off)
                else:
                    got = os.preadv(fd, [mv[:ln]], off)
                if got <= 0:
                    raise OSError("short %s at %d of %s" % ("write" if write else "read", off, paths[i]))
                off += got
            if write and COLD:
                os.fsync(fd)
            os.close(fd)
        except OSError as e:
            errs.append(str(e))

    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    if COLD and not write:
        drop_caches()
    t0 = time.monotonic()
    for t in th:
        t.start()
    for t in th:
        t.join()
    dt = time.monotonic() - t0
    if errs:
        raise SystemExit("plainio: " + errs[0])
    if not write:
        for p in paths:
            os.unlink(p)
    return total / dt / 1e9


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    d, total = sys.argv[1], int(sys.argv[2])
    best_w, best_r = (0.0, 0), (0.0, 0)
    for n in (int(x) for x in sys.argv[3:]):
        w = run(d, total, n, True)
        r = run(d, total, n, False)
        mode = (" O_DIRECT" if DIRECT else "") + (" cold" if COLD else "")
        print("plainio%s %d threads, %d files: write %.2f GB/s, read %.2f GB/s" % (mode, n, n, w, r), flush=True)
        best_w, best_r = max(best_w, (w, n)), max(best_r, (r, n))
    print("best write %.2f GB/s (%d threads) read %.2f GB/s (%d threads)" % (best_w + best_r))


if __name__ == "__main__":
    main()
