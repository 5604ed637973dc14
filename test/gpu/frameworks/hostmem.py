#!/usr/bin/env python3
"""hostmem.py - jobs.sh's control for a restore's host memory: a process
without CUDA that holds MIB of nonzero host memory, as a JAX job's
allocator table is (every byte 0xFF), so that criu's own time to restore
that much memory is measured apart from the GPU and the plugin.

  hostmem.py DIR --mib N [--pause-timeout S]

Writes DIR/pid, fills N MiB with 0xFF (every page written), writes
DIR/paused.1 ("hostmem pid P") and waits for DIR/go.1 (at most
--pause-timeout seconds): the checkpoint happens there. Then it counts the
0xFF bytes and writes DIR/done: "ok N" when every byte came back, else
"bad N GOOD" (exit 1).
"""
import argparse
import os
import sys
import time

from jaxjob import write_atomic  # beside this script; jaxjob imports jax only in main()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--mib", type=int, required=True)
    ap.add_argument("--pause-timeout", type=int, default=600)
    a = ap.parse_args()
    write_atomic(os.path.join(a.dir, "pid"), "%d\n" % os.getpid())
    size = a.mib << 20
    mem = bytearray(b"\xff") * size
    write_atomic(os.path.join(a.dir, "paused.1"), "hostmem pid %d\n" % os.getpid())
    go = os.path.join(a.dir, "go.1")
    t0 = time.monotonic()
    while not os.path.exists(go):
        if time.monotonic() - t0 > a.pause_timeout:
            print("hostmem: no %s within %d s" % (go, a.pause_timeout), file=sys.stderr)
            return 2
        time.sleep(0.05)
    good = mem.count(b"\xff")
    ok = good == size
    write_atomic(os.path.join(a.dir, "done"), ("ok %d\n" % size) if ok else ("bad %d %d\n" % (size, good)))
    print("hostmem: %d of %d bytes 0xFF after the restore" % (good, size))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
