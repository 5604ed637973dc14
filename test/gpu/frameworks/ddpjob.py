#!/usr/bin/env python3
"""ddpjob.py - a torch.distributed training job as torchrun starts it, for
jobs.sh (issue #46): the whole tree (torchrun's agent, its TCPStore, the
worker with an NCCL process group) must come back from a checkpoint taken
between two steps and train on bit for bit.

  torchrun --standalone --nproc_per_node=1 ddpjob.py DIR [--steps N] [--pause-at K]
           [--pause-timeout S]

The worker joins an NCCL process group (world size 1; the store is the
agent's TCPStore, reached over established loopback TCP connections),
wraps a small transformer (dropout on: the CUDA generator's state counts)
in DistributedDataParallel (its buckets all-reduced through NCCL each
step) and trains it with AdamW on a seeded synthetic dataset (host
generator, one batch copied to the device each step).

Rank 0 appends "step N loss HEX" to DIR/losses (float.hex(): bit for bit)
and prints it. With --pause-at K, after step K (the device idle) it writes
DIR/mem.1 (torch's allocated and reserved bytes) and DIR/paused.1
("step K worker PID agent PPID") and waits for DIR/go.1 (at most
--pause-timeout seconds): the checkpoint happens there. DIR/pids holds
"worker PID agent PPID" as soon as the group is up, DIR/info the versions,
DIR/done the steps at the end (before the group is destroyed).

Deterministic as trainjob.py: CUBLAS_WORKSPACE_CONFIG=:4096:8,
use_deterministic_algorithms, math attention, seeded generators; an
all-reduce over one rank is a copy.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# Never NVLink multicast.
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def nccl_version(torch):
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:
        return "? (%s)" % e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--pause-at", type=int, default=0)
    ap.add_argument("--pause-timeout", type=float, default=1800)
    a = ap.parse_args()
    d = a.dir
    os.makedirs(d, exist_ok=True)

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    try:  # device_id: the NCCL communicator made now, not at the first collective
        dist.init_process_group("nccl", device_id=dev)
    except TypeError:
        dist.init_process_group("nccl")
    if rank == 0:
        write_atomic(os.path.join(d, "pids"), "worker %d agent %d\n" % (os.getpid(), os.getppid()))
        info = {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": nccl_version(torch),
            "world": world,
            "backend": dist.get_backend(),
            "store": "%s:%s" % (os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")),
            "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("NCCL_", "TORCH_", "NVSHMEM_"))},
        }
        write_atomic(os.path.join(d, "info"), json.dumps(info) + "\n")
        print("ddpjob:", json.dumps(info), flush=True)

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.manual_seed(1234)
    torch.cuda.manual_seed_all(1234)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(1024, 256)
            layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.1, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(256, 1024)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)))

    g = torch.Generator().manual_seed(99 + rank)
    xs = torch.randint(0, 1024, (a.steps, 32, 64), generator=g)
    ys = torch.roll(xs, 1, dims=2)
    model = DDP(Net().to(dev), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = open(os.path.join(d, "losses"), "w") if rank == 0 else None
    for step in range(1, a.steps + 1):
        x, y = xs[step - 1].to(dev), ys[step - 1].to(dev)
        loss = nn.functional.cross_entropy(model(x).view(-1, 1024), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        line = "step %d loss %s" % (step, float(loss.item()).hex())
        if losses:
            losses.write(line + "\n")
            losses.flush()
            print(line, flush=True)
        if step == a.pause_at and step < a.steps and rank == 0:
            torch.cuda.synchronize()
            write_atomic(os.path.join(d, "mem.1"), "allocated %d reserved %d\n" % (
                torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
            write_atomic(os.path.join(d, "paused.1"), "step %d worker %d agent %d\n" % (step, os.getpid(), os.getppid()))
            t0 = time.monotonic()
            while not os.path.exists(os.path.join(d, "go.1")):
                if time.monotonic() - t0 > a.pause_timeout:
                    print("ddpjob: no go.1 within %.0f s" % a.pause_timeout, flush=True)
                    return 3
                time.sleep(0.05)
            print("ddpjob: going on after the pause", flush=True)
    if losses:
        losses.close()
        write_atomic(os.path.join(d, "done"), "steps %d\n" % a.steps)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
