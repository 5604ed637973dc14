#!/usr/bin/env python3
"""fwjob.py - real-framework jobs for the GPU suite (test/gpu/fw.sh).

    fwjob.py KIND DIR NPROCS [--mib N] [--cache-mib N] [--temp-mib N] [--arrays N]

KIND is one of
  torch-ipc     rank 0 shares a CUDA tensor with ranks 1..N-1 through
                torch.multiprocessing (spawn): CUDA IPC with the default caching
                allocator, cuMem POSIX FDs taken with pidfd_getfd under
                PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; every rank also
                holds private tensors, a cuBLAS product and a captured CUDA graph
  torch-async   one process on PyTorch's cudaMallocAsync backend (a private
                stream-ordered pool), allocating and freeing around the checkpoint
  llm           one process with a GPT-2-shaped transformers model (seeded random
                weights, fp16) plus --cache-mib of cache-like memory and,
                with --temp-mib, a freed computation of that size (its memory
                stays reserved by torch's caching allocator); greedy
                generation must be token-identical after a restore
  cupy-ipc      CuPy: rank 0 shares a cudaMalloc buffer through
                cudaIpcGetMemHandle, ranks 1..N-1 open it
  cupy-small    one process holding --arrays small CuPy arrays (its memory pool
                calls cudaMalloc per block); reports the device memory they use

The protocol is gpu_job's (test/gpu/gpu_job.c), so run.sh's cmd/answers work:
every rank writes DIR/r<rank>.ready ("pid <pid> ..."), polls DIR/cmd
("<seq> <verb> [args]") and answers in DIR/r<rank>.<seq> ("ok ..." or
"fail <why>"). Verbs: verify, add RANK K, graph, fresh, gen, churn, mem (torch's
allocated and reserved bytes), exit.
Checksums are exact integer sums computed on the GPU, so "verify" answers
can be compared across ranks and across a checkpoint.
"""
import argparse
import os
import sys
import time
import traceback

SEED = 1234


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.rename(tmp, path)


def isum(t):
    """Exact position-weighted checksum of a tensor's bytes (torch)."""
    import torch

    v = t.detach().contiguous().view(-1).view(torch.int32) if t.element_size() * t.numel() % 4 == 0 \
        else t.detach().contiguous().view(-1).view(torch.uint8)
    total = 0
    weighted = 0
    step = 1 << 24
    for off in range(0, v.numel(), step):
        c = v[off:off + step].to(torch.int64)
        w = (torch.arange(off, off + c.numel(), device=c.device, dtype=torch.int64) % 251) + 1
        total += int(c.sum().item())
        weighted += int((c * w).sum().item())
    return "%x.%x" % (total & (2**64 - 1), weighted & (2**64 - 1))


def csum(a):
    """The same checksum for a CuPy array."""
    import cupy

    v = a.ravel().view(cupy.int32)
    w = (cupy.arange(v.size, dtype=cupy.int64) % 251) + 1
    c = v.astype(cupy.int64)
    return "%x.%x" % (int(c.sum()) & (2**64 - 1), int((c * w).sum()) & (2**64 - 1))


class Rank:
    """One rank's state and its answers to the commands."""

    def __init__(self, kind, rank, args):
        self.kind, self.rank, self.args = kind, rank, args
        self.fresh = []
        self.fresh_rounds = 0  # "fresh" commands answered so far

    # ---- torch -------------------------------------------------------------
    def torch_setup(self, shared):
        import torch

        torch.manual_seed(SEED + self.rank)
        self.torch = torch
        self.shared = shared
        n = self.args.mib * (1 << 20) // 4
        g = torch.Generator(device="cuda").manual_seed(SEED + self.rank)
        self.private = torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, device="cuda", generator=g)
        self.private_sum = isum(self.private)
        self.a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16, generator=g)
        self.b = torch.randn(1024, 1024, device="cuda", dtype=torch.float16, generator=g)
        self.mm = (self.a @ self.b).cpu()
        self.gx = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")
        self.graph_runs = 0
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            self.gx.add_(1)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(s)
        self.gx.zero_()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.gx.add_(1)
        torch.cuda.synchronize()

    def torch_verify(self):
        torch = self.torch
        torch.cuda.synchronize()
        if isum(self.private) != self.private_sum:
            return "fail private tensor changed"
        if not torch.equal((self.a @ self.b).cpu(), self.mm):
            return "fail cuBLAS product differs"
        if int(self.gx[0].item()) != self.graph_runs or int(self.gx.sum().item()) != self.graph_runs * self.gx.numel():
            return "fail graph tensor holds %d, expected %d" % (int(self.gx[0].item()), self.graph_runs)
        for i, (t, want) in enumerate(self.fresh):
            if isum(t) != want:
                return "fail fresh tensor %d changed" % i
        sh = isum(self.shared) if self.shared is not None else "-"
        ptr = self.shared.data_ptr() if self.shared is not None else 0
        return "ok ptr %x shared %s private %s" % (ptr, sh, self.private_sum)

    # ---- commands ------------------------------------------------------------
    def do(self, verb, argv, ctx):
        if verb == "verify":
            return self.verify()
        if verb == "add":
            r, k = int(argv[0]), int(argv[1])
            if r == self.rank:
                self.add(k)
            return "ok"
        if verb == "graph":
            if self.kind != "torch-ipc":
                return "ok no graph"
            self.graph.replay()
            self.graph_runs += 1
            self.torch.cuda.synchronize()
            return "ok graph %d" % self.graph_runs
        if verb == "fresh":
            return self.do_fresh(ctx)
        if verb == "gen":
            return self.gen()
        if verb == "churn":
            return self.churn()
        if verb == "mem":
            if not getattr(self, "torch", None):
                return "ok allocated 0 reserved 0"
            self.torch.cuda.synchronize()
            return "ok allocated %d reserved %d" % (self.torch.cuda.memory_allocated(),
                                                    self.torch.cuda.memory_reserved())
        return "fail unknown verb %s" % verb

    def verify(self):
        if self.kind == "torch-ipc":
            return self.torch_verify()
        if self.kind == "torch-async":
            torch = self.torch
            torch.cuda.synchronize()
            sums = [isum(t) for t in self.pool]
            if sums != self.pool_sums:
                return "fail a pool tensor changed"
            return "ok pool %d tensors %s" % (len(sums), self.pool_sums[0])
        if self.kind == "llm":
            s = isum(self.cache)
            if s != self.cache_sum:
                return "fail cache memory changed"
            return "ok cache %s params %s" % (s, self.param_sum)
        if self.kind == "cupy-ipc":
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            if csum(self.private) != self.private_sum:
                return "fail private array changed"
            return "ok ptr %x shared %s private %s" % (self.ptr, csum(self.shared), self.private_sum)
        if self.kind == "cupy-small":
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            bad = [i for i, a in enumerate(self.arrays) if int(a[0]) != i or int(a[-1]) != i * 3]
            if bad:
                return "fail %d small arrays changed (first %d)" % (len(bad), bad[0])
            tot = int(sum(int(a.sum()) for a in self.arrays[:: max(1, len(self.arrays) // 64)]))
            return "ok arrays %d sample %d" % (len(self.arrays), tot)
        return "fail verify: unknown kind"

    def add(self, k):
        if self.kind == "torch-ipc":
            self.shared.add_(k)
            self.torch.cuda.synchronize()
        elif self.kind == "cupy-ipc":
            import cupy

            self.shared += k
            cupy.cuda.runtime.deviceSynchronize()

    def do_fresh(self, ctx):
        if self.kind != "torch-ipc":
            return "ok no fresh"
        torch = self.torch
        if self.rank == 0:
            v = 7 + self.fresh_rounds
            self.fresh_rounds += 1
            for q in ctx["to_children"]:
                t = torch.full((1 << 18,), v, dtype=torch.int32, device="cuda")
                q.put(t)
                self.fresh.append((t, isum(t)))
            torch.cuda.synchronize()
            return "ok sent %d" % len(ctx["to_children"])
        t = ctx["from_parent"].get(timeout=60)
        want = 7 + self.fresh_rounds
        self.fresh_rounds += 1
        if int(t.min().item()) != want or int(t.max().item()) != want:
            return "fail fresh tensor holds %d..%d, expected %d" % (int(t.min().item()), int(t.max().item()), want)
        self.fresh.append((t, isum(t)))
        return "ok fresh %x" % t.data_ptr()

    def gen(self):
        if self.kind != "llm":
            return "ok no model"
        torch = self.torch
        with torch.no_grad():
            out = self.model.generate(self.prompt, max_new_tokens=32, do_sample=False, num_beams=1,
                                      pad_token_id=0, attention_mask=torch.ones_like(self.prompt))
        toks = out[0, self.prompt.shape[1]:].tolist()
        return "ok tokens " + ",".join(str(t) for t in toks)

    def churn(self):
        """Allocate and free through the allocator after a restore."""
        if self.kind in ("torch-async", "torch-ipc", "llm"):
            torch = self.torch
            xs = [torch.full((1 << 16,), i, dtype=torch.int32, device="cuda") for i in range(64)]
            torch.cuda.synchronize()
            ok = all(int(x[5].item()) == i for i, x in enumerate(xs))
            del xs
            torch.cuda.synchronize()
            return "ok churn" if ok else "fail churn values"
        if self.kind.startswith("cupy"):
            import cupy

            xs = [cupy.full((1024,), i, dtype=cupy.int32) for i in range(256)]
            ok = all(int(x[7]) == i for i, x in enumerate(xs))
            return "ok churn" if ok else "fail churn values"
        return "ok"


def used_mib():
    """Device memory in use (cudaMemGetInfo), in MiB; starts the context."""
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    return (total - free) / (1 << 20)


def serve(r, d, ctx, info):
    write_atomic(os.path.join(d, "r%d.ready" % r.rank), "pid %d %s" % (os.getpid(), info))
    cmdp = os.path.join(d, "cmd")
    last = 0
    while True:
        try:
            with open(cmdp) as f:
                line = f.read().split()
        except FileNotFoundError:
            line = []
        if line and int(line[0]) > last:
            last = int(line[0])
            verb = line[1]
            if verb == "exit":
                write_atomic(os.path.join(d, "r%d.%d" % (r.rank, last)), "ok bye")
                return
            try:
                ans = r.do(verb, line[2:], ctx)
            except Exception as e:  # the answer says what broke
                ans = "fail %s: %s" % (type(e).__name__, str(e).replace("\n", " ")[:300])
                traceback.print_exc()
            write_atomic(os.path.join(d, "r%d.%d" % (r.rank, last)), ans)
            continue
        time.sleep(0.02)


def child_main(kind, rank, d, args, from_parent, payload):
    try:
        r = Rank(kind, rank, args)
        if kind == "torch-ipc":
            import torch

            torch.cuda.init()
            shared = from_parent.get(timeout=120)
            r.torch_setup(shared)
            serve(r, d, {"from_parent": from_parent}, "va %x" % shared.data_ptr())
        elif kind == "cupy-ipc":
            import cupy

            ptr = cupy.cuda.runtime.ipcOpenMemHandle(payload["handle"])
            mem = cupy.cuda.UnownedMemory(ptr, payload["nbytes"], None)
            r.ptr = ptr
            r.shared = cupy.ndarray((payload["nbytes"] // 4,), cupy.int32, cupy.cuda.MemoryPointer(mem, 0))
            cupy.random.seed(SEED + rank)
            r.private = cupy.random.randint(-2**31, 2**31 - 1, size=args.mib * (1 << 18), dtype=cupy.int32)
            r.private_sum = csum(r.private)
            serve(r, d, {}, "va %x" % ptr)
    except Exception as e:
        write_atomic(os.path.join(d, "r%d.failed" % rank), "%s: %s" % (type(e).__name__, e))
        traceback.print_exc()
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind")
    ap.add_argument("dir")
    ap.add_argument("nprocs", type=int)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--cache-mib", type=int, default=2048)
    ap.add_argument("--temp-mib", type=int, default=0)
    ap.add_argument("--arrays", type=int, default=2000)
    args = ap.parse_args()
    kind, d, n = args.kind, args.dir, args.nprocs
    os.makedirs(d, exist_ok=True)
    try:
        if kind in ("torch-ipc", "cupy-ipc"):
            run_group(kind, d, n, args)
        else:
            run_single(kind, d, args)
    except Exception as e:
        write_atomic(os.path.join(d, "r0.failed"), "%s: %s" % (type(e).__name__, e))
        traceback.print_exc()
        sys.exit(1)


def run_group(kind, d, n, args):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    r = Rank(kind, 0, args)
    queues = [ctx.Queue() for _ in range(n - 1)]
    procs = []
    if kind == "torch-ipc":
        import torch

        torch.cuda.init()
        nel = args.mib * (1 << 20) // 4
        shared = torch.arange(nel, dtype=torch.int32, device="cuda")
        for i in range(1, n):
            p = ctx.Process(target=child_main, args=(kind, i, d, args, queues[i - 1], None))
            p.start()
            procs.append(p)
            queues[i - 1].put(shared)
        r.torch_setup(shared)
        info = "va %x alloc %s" % (shared.data_ptr(), os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"))
    else:
        import cupy

        nbytes = args.mib * (1 << 20)
        ptr = cupy.cuda.runtime.malloc(nbytes)
        mem = cupy.cuda.UnownedMemory(ptr, nbytes, None)
        r.shared = cupy.ndarray((nbytes // 4,), cupy.int32, cupy.cuda.MemoryPointer(mem, 0))
        r.shared[...] = cupy.arange(nbytes // 4, dtype=cupy.int32)
        cupy.random.seed(SEED)
        r.private = cupy.random.randint(-2**31, 2**31 - 1, size=args.mib * (1 << 18), dtype=cupy.int32)
        r.private_sum = csum(r.private)
        r.ptr = ptr
        cupy.cuda.runtime.deviceSynchronize()
        handle = cupy.cuda.runtime.ipcGetMemHandle(ptr)
        for i in range(1, n):
            p = ctx.Process(target=child_main,
                            args=(kind, i, d, args, None, {"handle": handle, "nbytes": nbytes}))
            p.start()
            procs.append(p)
        info = "va %x" % ptr
    serve(r, d, {"to_children": queues}, info)
    for p in procs:
        p.join(timeout=30)


def run_single(kind, d, args):
    r = Rank(kind, 0, args)
    if kind == "torch-async":
        import torch

        r.torch = torch
        torch.manual_seed(SEED)
        r.pool = [torch.randint(-2**31, 2**31 - 1, (args.mib * (1 << 18) // 16,), dtype=torch.int32, device="cuda")
                  for _ in range(16)]
        r.pool = r.pool[1::2]  # every other block goes back to the pool
        torch.cuda.synchronize()
        r.pool_sums = [isum(t) for t in r.pool]
        info = "backend %s" % torch.cuda.get_allocator_backend()
    elif kind == "llm":
        import torch
        import transformers

        r.torch = torch
        torch.manual_seed(SEED)
        cfg = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        r.model = transformers.GPT2LMHeadModel(cfg).half().cuda().eval()
        r.param_sum = "%x" % (sum(int(p.detach().view(torch.int16).to(torch.int64).sum().item())
                                  for p in r.model.parameters()) & (2**64 - 1))
        g = torch.Generator(device="cuda").manual_seed(SEED)
        r.cache = torch.randint(-2**31, 2**31 - 1, (args.cache_mib * (1 << 18),), dtype=torch.int32, device="cuda",
                                generator=g)
        r.cache_sum = isum(r.cache)
        if args.temp_mib:
            # a computation's temporaries, freed: the caching allocator keeps
            # their memory reserved (what a checkpoint carries unless released)
            t = torch.ones((args.temp_mib * (1 << 18),), dtype=torch.float32, device="cuda")
            r.temp_sum = float((t * 2).sum().item())
            del t
        r.prompt = torch.randint(0, 50257, (1, 16), device="cuda", generator=g)
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        info = "model gpt2-shaped fp16 cache %d MiB used %.1f MiB" % (args.cache_mib, (total - free) / (1 << 20))
    elif kind == "cupy-small":
        import cupy

        base = used_mib()
        r.arrays = []
        for i in range(args.arrays):
            a = cupy.empty((1024,), dtype=cupy.int32)  # 4 KiB each
            a[...] = i
            a[-1] = i * 3
            r.arrays.append(a)
        cupy.cuda.runtime.deviceSynchronize()
        info = "arrays %d used_mib %.1f" % (args.arrays, used_mib() - base)
    else:
        raise SystemExit("fwjob.py: unknown kind %s" % kind)
    serve(r, d, {}, info)


if __name__ == "__main__":
    main()
