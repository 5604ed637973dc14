#!/usr/bin/env python3
"""jaxjob.py - a deterministic JAX training job for jobs.sh (issue #46): a
JAX process must come back from a checkpoint taken between two steps and
go on training bit for bit as if nothing had happened.

  jaxjob.py DIR [--steps N] [--pause-at K] [--width W] [--depth D]
            [--batch B] [--ballast-mib M] [--pause-timeout S]

An MLP (DEPTH hidden layers of WIDTH, GELU) learns seeded random labels of
seeded random inputs (numpy's generator, on the host; one batch copied to
the device each step) with AdamW: optax.adamw when optax imports, else the
same update written out with jax.grad (no dependency beyond jax). Beside
the model, a BALLAST-MIB uint32 array on the device that every step
rewrites (an LCG) and checksums (an integer sum, exact in any order), so
that a restore that loses or mixes up bytes shows in the step lines too.

Each step appends "step N loss HEX ballast HEX8" to DIR/losses (the loss
as float.hex(): bit for bit) and prints it. With --pause-at K, after step K
(everything on the device finished) it writes DIR/mem.1 (the device's
memory_stats(), JSON) and DIR/paused.1 ("step K pid P") and waits for
DIR/go.1 (at most --pause-timeout seconds): the checkpoint happens there.
Without it, the run is the reference. DIR/pid holds the process's pid
(written first), DIR/info the platform, versions, optimizer and allocator
environment, DIR/done the number of steps at the end.

The allocator is JAX's, as the environment sets it (jobs.sh's variants):
XLA_PYTHON_CLIENT_PREALLOCATE unset (75% of the GPU preallocated),
XLA_PYTHON_CLIENT_PREALLOCATE=false, XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async.
Determinism across runs is jobs.sh's XLA_FLAGS (deterministic ops, no
autotuning), probed there; no gather or scatter in the model (one-hot
labels), so no atomics.
"""
import argparse
import json
import os
import sys
import time

# Never NVLink multicast (no collective here, but the rule is every process's).
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)


def write_atomic(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--pause-at", type=int, default=0)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--inputs", type=int, default=512)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ballast-mib", type=int, default=1024)
    ap.add_argument("--pause-timeout", type=float, default=1800)
    a = ap.parse_args()
    d = a.dir
    os.makedirs(d, exist_ok=True)
    write_atomic(os.path.join(d, "pid"), "%d\n" % os.getpid())

    import numpy as np
    import jax
    import jax.numpy as jnp

    try:
        import optax
    except ImportError:
        optax = None
    tmap = jax.tree.map if hasattr(jax, "tree") else jax.tree_util.tree_map

    dev = jax.devices()[0]
    if dev.platform != "gpu":
        write_atomic(os.path.join(d, "failed"), "JAX runs on %s, not a GPU\n" % dev.platform)
        print("jaxjob: JAX runs on %s, not a GPU" % dev.platform, flush=True)
        return 1
    info = {
        "pid": os.getpid(),
        "jax": jax.__version__,
        "device": str(getattr(dev, "device_kind", dev)),
        "optimizer": "optax.adamw %s" % optax.__version__ if optax else "manual AdamW (no optax)",
        "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith(("XLA_", "JAX_", "TF_GPU"))},
    }
    write_atomic(os.path.join(d, "info"), json.dumps(info) + "\n")
    print("jaxjob:", json.dumps(info), flush=True)

    # Seeded parameters and data, on the host (numpy), bit for bit each run.
    rng = np.random.default_rng(1234)
    sizes = [a.inputs] + [a.width] * a.depth + [a.classes]
    params = []
    for m, n in zip(sizes[:-1], sizes[1:]):
        w = (rng.standard_normal((m, n)) * np.sqrt(2.0 / m)).astype(np.float32)
        params.append((jnp.asarray(w), jnp.zeros((n,), jnp.float32)))
    xs = rng.standard_normal((a.steps, a.batch, a.inputs)).astype(np.float32)
    ys = rng.integers(0, a.classes, (a.steps, a.batch)).astype(np.int32)

    def forward(p, x):
        for w, b in p[:-1]:
            x = jax.nn.gelu(x @ w + b)
        w, b = p[-1]
        return x @ w + b

    def loss_fn(p, x, y):
        logp = jax.nn.log_softmax(forward(p, x))
        onehot = (y[:, None] == jnp.arange(a.classes)[None, :]).astype(logp.dtype)
        return -jnp.mean(jnp.sum(onehot * logp, axis=-1))

    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 1e-2
    if optax:
        opt = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd)
        state = opt.init(params)

        def update(p, s, x, y):
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            u, s = opt.update(g, s, p)
            return optax.apply_updates(p, u), s, loss
    else:
        state = (tmap(jnp.zeros_like, params), tmap(jnp.zeros_like, params), jnp.zeros((), jnp.float32))

        def update(p, s, x, y):
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            m, v, t = s
            t = t + 1.0
            m = tmap(lambda m_, g_: b1 * m_ + (1 - b1) * g_, m, g)
            v = tmap(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, v, g)
            c1, c2 = 1 - b1**t, 1 - b2**t
            p = tmap(lambda p_, m_, v_: p_ - lr * ((m_ / c1) / (jnp.sqrt(v_ / c2) + eps) + wd * p_), p, m, v)
            return p, (m, v, t), loss

    step_fn = jax.jit(update, donate_argnums=(0, 1))

    def churn(b, s):
        b = b * jnp.uint32(1664525) + jnp.uint32(1013904223) + s.astype(jnp.uint32)
        return b, jnp.sum(b, dtype=jnp.uint32)

    churn_fn = jax.jit(churn, donate_argnums=(0,))
    ballast = jax.random.bits(jax.random.PRNGKey(7), (max(a.ballast_mib, 1) << 18,), dtype=jnp.uint32)

    losses = open(os.path.join(d, "losses"), "w")
    for step in range(1, a.steps + 1):
        x, y = jax.device_put(xs[step - 1], dev), jax.device_put(ys[step - 1], dev)
        params, state, loss = step_fn(params, state, x, y)
        ballast, ck = churn_fn(ballast, jnp.asarray(step, jnp.int32))
        line = "step %d loss %s ballast %08x" % (step, float(loss).hex(), int(ck))
        losses.write(line + "\n")
        losses.flush()
        print(line, flush=True)
        if step == a.pause_at and step < a.steps:
            jax.block_until_ready((params, state, ballast))
            try:
                stats = dev.memory_stats() or {}
            except Exception as e:  # not every allocator keeps them
                stats = {"error": str(e)}
            write_atomic(os.path.join(d, "mem.1"), json.dumps(stats) + "\n")
            write_atomic(os.path.join(d, "paused.1"), "step %d pid %d\n" % (step, os.getpid()))
            t0 = time.monotonic()
            while not os.path.exists(os.path.join(d, "go.1")):
                if time.monotonic() - t0 > a.pause_timeout:
                    print("jaxjob: no go.1 within %.0f s" % a.pause_timeout, flush=True)
                    return 3
                time.sleep(0.05)
            print("jaxjob: going on after the pause", flush=True)
    losses.close()
    write_atomic(os.path.join(d, "done"), "steps %d\n" % a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
