"""Epoch time of mlptrain against its strongest peers for the same MNIST MLP, on one GPU, in one run.

Every tool trains 784-512-512-10 (ReLU; --hidden) with Adam (lr 1e-3) on the 55,000 training images at
--batch-size, with the whole dataset already on the GPU as uint8 and each batch gathered + normalised on
the device, and times whole epochs (the last, partial batch included):

- mlptrain: its own epoch loop (`mlptrain.training.loop.train_epoch`, with its periodic metric reads);
- PyTorch eager: the plain loop (TF32 off; fp16 with autocast + GradScaler, bf16 with autocast);
- PyTorch graph: the whole step (gather, forward, backward, fused capturable Adam) captured as one CUDA
  graph and replayed once a step, the partial batch eager (fp32, bf16: GradScaler's overflow check reads
  the host, so no fp16);
- JAX: one `jax.jit` over the epoch, the steps a `lax.scan` (the partial batch one more jitted step),
  optax Adam, matmul precision "highest" (fp32; bf16 casts the parameters and inputs in the step, as
  autocast does; no fp16: optax has no dynamic loss scaling).

Each tool is warmed up for one epoch (JAX's compiles there), then timed over --epochs epochs; the table
shows medians, µs per step and every row's speed relative to JAX's (JAX's s/epoch over the row's: above 1
is faster than JAX). Each tool's loss must have fallen after the warm-up epoch (below WARM_UP_LOSS, from
ln 10 = 2.30 at chance) and be below FINAL_LOSS at the end, else the script exits 1: a speed of a kernel
that does not learn is not reported.

    python benchmarks/mlp_mnist.py [--epochs 5] [--batch-size 128] [--hidden 512,512]
                                   [--precisions fp32,fp16,bf16] [--tools mlptrain,eager,graph,jax]
                                   [--peer-device cuda] [--backend cuda] [--json FILE]

(--peer-device cpu runs the eager and JAX peers on the CPU, --backend cpu mlptrain: a check of the script on a
machine without a GPU.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

WARM_UP_LOSS = 2.0  # one epoch of Adam 1e-3 on MNIST ends near 0.1 at batch 128, 0.5 at batch 2048
FINAL_LOSS = 1.0


def check_learning(tool: str, precision: str, loss: float, limit: float, when: str) -> None:
    """Exit 1 when `loss` is not finite or not below `limit`."""
    if not loss < limit:  # `not <`: NaN fails too
        raise SystemExit(f"WRONG RESULT: {tool} {precision}: training loss {loss:.4g} {when} is not below "
                         f"{limit:g}; nothing is reported")


def mlptrain_epochs(dataset, args, precision) -> list[float]:
    from mlptrain.backends.selection import get_backend
    from mlptrain.config.load import config_from_dict
    from mlptrain.training.loop import train_epoch
    from mlptrain.training.session import build_session

    config = config_from_dict({
        "backend": args.backend, "seed": 0,
        "model": {"hidden": args.hidden},
        "optim": {"name": "adam", "lr": 1e-3},
        "train": {"batch_size": args.batch_size, "epochs": args.epochs + 1, "precision": precision},
    })
    backend = get_backend(args.backend)
    session = build_session(config, backend, dataset)
    times, reads = [], []
    for epoch in range(args.epochs + 1):
        backend.synchronize()
        t0 = time.perf_counter()
        train_epoch(session, epoch + 1, reads.append)
        backend.synchronize()
        times.append(time.perf_counter() - t0)
        if epoch == 0:
            check_learning("mlptrain", precision, reads[-1]["loss"], WARM_UP_LOSS, "after the warm-up epoch")
    check_learning("mlptrain", precision, reads[-1]["loss"], FINAL_LOSS, "at the end")
    print(f"mlptrain {precision}: last window loss {reads[-1]['loss']:.4f} acc {reads[-1]['acc']:.4f}")
    return times[1:]


TOOLS = ("mlptrain", "eager", "graph", "jax")
NAMES = {"mlptrain": "mlptrain", "eager": "PyTorch eager", "graph": "PyTorch CUDA graph", "jax": "JAX jit+scan"}
PRECISIONS = {"mlptrain": ("fp32", "fp16", "bf16"), "eager": ("fp32", "fp16", "bf16"), "graph": ("fp32", "bf16"),
              "jax": ("fp32", "bf16")}


def train_rows(dataset) -> np.ndarray:
    """The training split's rows of the images: all but the 5,000 validation rows mlptrain holds out by default
    (the same draw for every peer)."""
    val = np.random.default_rng([0, 0x5EED]).permutation(len(dataset.train_images))[:5000]
    return np.setdiff1d(np.arange(len(dataset.train_images)), val)


def epoch_order(rows: np.ndarray, epoch: int) -> np.ndarray:
    return rows[np.random.default_rng([epoch, 0xE90C]).permutation(len(rows))]


def torch_model(dataset, args, device):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    widths = [dataset.train_images.shape[1], *args.hidden, dataset.num_classes]
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(widths) - 2 else [])
    model = torch.nn.Sequential(*layers).to(device)
    images = torch.tensor(dataset.train_images, device=device)
    labels = torch.tensor(dataset.train_labels, device=device).long()
    return model, images, labels


def timed_epochs(args, tool, precision, run_epoch, sync):
    """Runs `run_epoch(epoch)` (which returns the loss of its last batch as a 0-d array) args.epochs + 1 times,
    checks the loss after the first (warm-up) and the last; returns the times of all but the first."""
    times = []
    for epoch in range(args.epochs + 1):
        sync()
        t0 = time.perf_counter()
        loss = run_epoch(epoch)
        sync()
        times.append(time.perf_counter() - t0)
        if epoch == 0:
            check_learning(tool, precision, float(loss), WARM_UP_LOSS, "after the warm-up epoch")
    check_learning(tool, precision, float(loss), FINAL_LOSS, "at the end")
    print(f"{tool} {precision}: last batch loss {float(loss):.4f}")
    return times[1:]


def pytorch_epochs(dataset, args, precision) -> list[float]:
    import torch

    device = torch.device(args.peer_device)
    model, images, labels = torch_model(dataset, args, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(args.peer_device, enabled=precision == "fp16")
    mean, std, rows = dataset.mean, dataset.std, train_rows(dataset)

    def run_epoch(epoch):
        order = torch.tensor(epoch_order(rows, epoch), device=device)
        for start in range(0, len(order), args.batch_size):
            batch = order[start:start + args.batch_size]
            x = (images[batch].float() / 255.0 - mean) / std
            with torch.autocast(args.peer_device, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(x), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss.detach().cpu()

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    return timed_epochs(args, "pytorch eager", precision, run_epoch, sync)


def pytorch_graph_epochs(dataset, args, precision) -> list[float]:
    """The whole step as one CUDA graph (PyTorch's documented whole-network capture): fused capturable Adam, the
    batch's rows copied into the graph's index buffer before each replay."""
    import torch

    device = torch.device("cuda")
    model, images, labels = torch_model(dataset, args, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True, capturable=True)
    autocast_dtype = {"bf16": torch.bfloat16}.get(precision)
    mean, std, rows = dataset.mean, dataset.std, train_rows(dataset)

    def step(batch):
        x = (images[batch].float() / 255.0 - mean) / std
        # cache_enabled=False: autocast's weight-cast cache must not outlive a graph's capture
        with torch.autocast("cuda", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None,
                            cache_enabled=False):
            loss = torch.nn.functional.cross_entropy(model(x), labels[batch])
        loss.backward()
        optimizer.step()
        return loss

    static_rows = torch.tensor(epoch_order(rows, 0)[:args.batch_size], device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up steps the capture needs (they train, as steps of epoch 0 would)
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            step(static_rows)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = step(static_rows)

    def run_epoch(epoch):
        order = torch.tensor(epoch_order(rows, epoch), device=device)
        full = len(order) // args.batch_size * args.batch_size
        for start in range(0, full, args.batch_size):
            static_rows.copy_(order[start:start + args.batch_size])
            graph.replay()
        if full < len(order):  # the partial batch, eager; its gradients are written where the graph reads them
            for p in model.parameters():
                p.grad.zero_()
            return step(order[full:]).detach().cpu()
        return static_loss.detach().cpu()

    return timed_epochs(args, "pytorch graph", precision, run_epoch, torch.cuda.synchronize)


def jax_epochs(dataset, args, precision) -> list[float]:
    """One `jax.jit` over the epoch's full batches (`lax.scan`), and the partial batch one jitted step more."""
    import jax
    import jax.numpy as jnp
    import optax

    jax.config.update("jax_default_matmul_precision", "highest")
    device = jax.devices(args.peer_device)[0]
    compute = jnp.bfloat16 if precision == "bf16" else jnp.float32
    widths = [dataset.train_images.shape[1], *args.hidden, dataset.num_classes]
    keys = jax.random.split(jax.random.PRNGKey(0), 2 * len(widths))
    params = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):  # PyTorch Linear's default initialisation
        bound = 1.0 / np.sqrt(a)
        params.append((jax.random.uniform(keys[2 * i], (a, b), jnp.float32, -bound, bound),
                       jax.random.uniform(keys[2 * i + 1], (b,), jnp.float32, -bound, bound)))
    params = jax.device_put(params, device)
    images = jax.device_put(dataset.train_images, device)
    labels = jax.device_put(dataset.train_labels.astype(np.int32), device)
    mean, std, rows = dataset.mean, dataset.std, train_rows(dataset)
    optimizer = optax.adam(1e-3)
    opt_state = jax.device_put(optimizer.init(params), device)

    def loss_fn(params, x, y):
        h = x.astype(compute)
        for i, (w, b) in enumerate(params):
            h = h @ w.astype(compute) + b.astype(compute)
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def step(carry, batch):
        params, opt_state = carry
        x = (images[batch].astype(jnp.float32) / 255.0 - mean) / std
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels[batch])
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    @jax.jit
    def full_batches(params, opt_state, order):  # order (steps, batch)
        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), order)
        return params, opt_state, losses[-1]

    @jax.jit
    def one_step(params, opt_state, batch):
        (params, opt_state), loss = step((params, opt_state), batch)
        return params, opt_state, loss

    state = [params, opt_state]

    def run_epoch(epoch):
        order = epoch_order(rows, epoch)
        full = len(order) // args.batch_size * args.batch_size
        steps = jax.device_put(order[:full].reshape(-1, args.batch_size).astype(np.int32), device)
        rest = jax.device_put(order[full:].astype(np.int32), device)
        state[0], state[1], loss = full_batches(state[0], state[1], steps)
        if full < len(order):
            state[0], state[1], loss = one_step(state[0], state[1], rest)
        jax.block_until_ready(state)  # the last update too, not only the loss before it
        return np.asarray(loss)

    return timed_epochs(args, "jax", precision, run_epoch, lambda: None)


def flops_per_epoch(samples: int, widths: list[int]) -> float:
    """Forward, weight-gradient and input-gradient GEMMs (none for the input layer): 2 flops per MAC."""
    macs = sum(a * b for a, b in zip(widths[:-1], widths[1:]))
    input_grad_macs = macs - widths[0] * widths[1]
    return 2.0 * samples * (2 * macs + input_grad_macs)


EPOCHS = {"mlptrain": mlptrain_epochs, "eager": pytorch_epochs, "graph": pytorch_graph_epochs, "jax": jax_epochs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=lambda s: [int(w) for w in s.split(",")], default=[512, 512])
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32", "fp16", "bf16"])
    parser.add_argument("--tools", type=lambda s: s.split(","), default=list(TOOLS))
    parser.add_argument("--peer-device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--backend", default="cuda", choices=["cuda", "cpu"], help="mlptrain's")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    unknown = set(args.tools) - set(TOOLS)
    if unknown:
        raise SystemExit(f"unknown tools {sorted(unknown)} (expected some of {', '.join(TOOLS)})")

    from mlptrain.data import load_dataset

    dataset = load_dataset("mnist")
    widths = [dataset.train_images.shape[1], *args.hidden, dataset.num_classes]
    samples = len(train_rows(dataset))
    steps = -(-samples // args.batch_size)
    flops = flops_per_epoch(samples, widths)
    rows = []
    for precision in args.precisions:
        for tool in args.tools:
            if precision in PRECISIONS[tool]:
                seconds = statistics.median(EPOCHS[tool](dataset, args, precision))
                rows.append({"workload": f"MLP {'-'.join(map(str, widths))}, batch {args.batch_size}",
                             "precision": precision, "tool": NAMES[tool], "s_per_epoch": seconds,
                             "us_per_step": seconds / steps * 1e6, "tflops": flops / seconds / 1e12,
                             "epochs_timed": args.epochs})
    for row in rows:  # every row against JAX in its precision, else JAX's fp32
        jax_row = next((r for p in (row["precision"], "fp32") for r in rows
                        if r["tool"] == NAMES["jax"] and r["precision"] == p), None)
        row["vs_jax"] = jax_row["s_per_epoch"] / row["s_per_epoch"] if jax_row else None
        row["jax_precision"] = jax_row["precision"] if jax_row else None
    print(f"\n{rows[0]['workload'] if rows else ''}, Adam, {samples:,} images, {steps} steps an epoch, "
          f"median of {args.epochs} epochs")
    print("| precision | tool | s/epoch | µs/step | TFLOP/s | x JAX (its s/epoch over this) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        vs = "" if r["vs_jax"] is None else f"{r['vs_jax']:.2f}x" + (
            "" if r["jax_precision"] == r["precision"] else f" (JAX {r['jax_precision']})")
        print(f"| {r['precision']} | {r['tool']} | {r['s_per_epoch']:.4f} | {r['us_per_step']:.1f} | "
              f"{r['tflops']:.2f} | {vs} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
