#!/usr/bin/env python3
"""trainjob.py - a deterministic PyTorch training job with forked children,
for forked.sh: processes forked from a CUDA process must survive a
checkpoint.

  trainjob.py DIR [--workers N] [--persistent] [--steps N] [--pause-every N]
              [--fork-helper] [--nvml-helper] [--compile]

A small transformer (dropout, AdamW, bf16 autocast) trains on a seeded
synthetic dataset through DataLoader(num_workers=N, pin_memory=True), the
workers forked from the CUDA process (Linux's default start method). Each
step appends the loss (float.hex) to DIR/losses. Every --pause-every steps,
in the middle of an epoch (the workers alive, batches prefetched), it writes
DIR/mem.K (torch's allocated and reserved bytes) and DIR/paused.K and
waits for DIR/go.K: the checkpoint happens there. Without
--pause-every it runs straight through: the reference losses.

--fork-helper: after the first CUDA call, fork a child that only sleeps
(it inherits the driver's device mappings). --nvml-helper: before any CUDA
call, fork a child that initializes NVML (libnvidia-ml) and polls the GPU
count, never calling CUDA. --compile: torch.compile the model (Inductor;
its compile workers are forked from the CUDA process).

Deterministic as docs/driver-facts.md says ('Frameworks'): CUBLAS_WORKSPACE_CONFIG=:4096:8,
use_deterministic_algorithms, seeded CPU/CUDA RNG and DataLoader generator,
math attention: losses are bit-identical from run to run.
"""
import argparse
import ctypes
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def nvml_helper(d):
    """Child: NVML only, never CUDA; answers in DIR/nvml.log."""
    pid = os.fork()
    if pid:
        return pid
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        rc = nvml.nvmlInit_v2()
        n = ctypes.c_uint(0)
        with open(os.path.join(d, "nvml.log"), "a") as f:
            f.write("init %d\n" % rc)
        while True:
            rc = nvml.nvmlDeviceGetCount_v2(ctypes.byref(n))
            with open(os.path.join(d, "nvml.log"), "a") as f:
                f.write("count rc %d n %d\n" % (rc, n.value))
            time.sleep(1)
    finally:
        os._exit(1)


def sleep_helper(d):
    """Child forked after CUDA init: sleeps; on SIGUSR1 tries CUDA and
    writes what the driver said to DIR/helper.log."""
    import signal

    pid = os.fork()
    if pid:
        return pid

    def probe(*_):
        cuda = ctypes.CDLL("libcuda.so.1")
        rc = cuda.cuInit(0)
        with open(os.path.join(d, "helper.log"), "a") as f:
            f.write("cuInit %d\n" % rc)

    signal.signal(signal.SIGUSR1, probe)
    try:
        while True:
            time.sleep(1)
    finally:
        os._exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--pause-every", type=int, default=0)
    ap.add_argument("--fork-helper", action="store_true")
    ap.add_argument("--nvml-helper", action="store_true")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    d = a.dir
    os.makedirs(d, exist_ok=True)
    helpers = []
    if a.nvml_helper:
        helpers.append(nvml_helper(d))

    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)
    dev = torch.device("cuda")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(512, 128)
            layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.1, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(128, 512)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)))

    g = torch.Generator().manual_seed(99)
    xs = torch.randint(0, 512, (1024, 32), generator=g)  # 16 steps an epoch
    ys = torch.roll(xs, 1, dims=1)
    model = Net().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model) if a.compile else model
    if a.fork_helper:
        helpers.append(sleep_helper(d))
    loader = DataLoader(TensorDataset(xs, ys), batch_size=64, shuffle=True, num_workers=a.workers,
                        pin_memory=True, persistent_workers=a.persistent and a.workers > 0,
                        generator=torch.Generator().manual_seed(7))
    with open(os.path.join(d, "pids"), "w") as f:
        f.write(" ".join(str(p) for p in [os.getpid()] + helpers) + "\n")
    losses = open(os.path.join(d, "losses"), "w")
    step, pause = 0, 0
    while step < a.steps:
        for x, y in loader:
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(fwd(x).float().view(-1, 512), y.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            losses.write(float(loss.item()).hex() + "\n")
            losses.flush()
            if a.pause_every and step % a.pause_every == 0 and step < a.steps:
                pause += 1
                torch.cuda.synchronize()
                kids = os.popen("ps -o pid= --ppid %d" % os.getpid()).read().split()
                with open(os.path.join(d, "mem.%d" % pause), "w") as f:
                    f.write("allocated %d reserved %d\n" % (torch.cuda.memory_allocated(),
                                                          torch.cuda.memory_reserved()))
                with open(os.path.join(d, "paused.%d.tmp" % pause), "w") as f:
                    f.write("step %d children %s\n" % (step, " ".join(kids)))
                os.rename(os.path.join(d, "paused.%d.tmp" % pause), os.path.join(d, "paused.%d" % pause))
                while not os.path.exists(os.path.join(d, "go.%d" % pause)):
                    time.sleep(0.05)
            if step >= a.steps:
                break
    losses.close()
    for p in helpers:
        os.kill(p, 9)
    with open(os.path.join(d, "done"), "w") as f:
        f.write("steps %d\n" % step)


if __name__ == "__main__":
    sys.exit(main())
