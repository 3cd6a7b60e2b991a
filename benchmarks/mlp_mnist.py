"""Epoch time of mlptrain against PyTorch eager for the same MNIST MLP, on one GPU, in one run.

Both train 784-512-512-10 (ReLU) with Adam (lr 1e-3) on the 55,000 training
images at batch 128, with the whole dataset already on the GPU as uint8 and
batches gathered + normalised on the device, in each precision asked for:
fp32 (PyTorch with TF32 off), fp16 (mlptrain's dynamic loss scaling; PyTorch
autocast + GradScaler) and bf16 (autocast, no scaler). mlptrain runs its own
epoch loop (`mlptrain.training.loop.train_epoch`, with its periodic metric reads);
PyTorch runs the plain eager loop. Each is warmed up for one epoch, then
timed over --epochs epochs; the table shows medians. Each tool's loss must have
fallen after the warm-up epoch (below WARM_UP_LOSS, from ln 10 = 2.30 at chance)
and be below FINAL_LOSS at the end, else the script exits 1: a speed of a
kernel that does not learn is not reported.

    python benchmarks/mlp_mnist.py [--epochs 5] [--batch-size 128] [--hidden 512,512]
                                   [--precisions fp32,fp16,bf16] [--json FILE]
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
        "backend": "cuda", "seed": 0,
        "model": {"hidden": args.hidden},
        "optim": {"name": "adam", "lr": 1e-3},
        "train": {"batch_size": args.batch_size, "epochs": args.epochs + 1, "precision": precision},
    })
    backend = get_backend("cuda")
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


def pytorch_epochs(dataset, args, precision) -> list[float]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    device = torch.device("cuda")
    val = np.random.default_rng([0, 0x5EED]).permutation(len(dataset.train_images))[:5000]
    train_index = torch.tensor(np.setdiff1d(np.arange(len(dataset.train_images)), val), device=device)
    images = torch.tensor(dataset.train_images, device=device)
    labels = torch.tensor(dataset.train_labels, device=device).long()
    widths = [images.shape[1], *args.hidden, dataset.num_classes]
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [torch.nn.Linear(a, b)] + ([torch.nn.ReLU()] if i < len(widths) - 2 else [])
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    mean, std = dataset.mean, dataset.std
    times = []
    for epoch in range(args.epochs + 1):
        generator = torch.Generator(device=device).manual_seed(epoch)
        order = train_index[torch.randperm(len(train_index), device=device, generator=generator)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for start in range(0, len(order), args.batch_size):
            rows = order[start:start + args.batch_size]
            x = (images[rows].float() / 255.0 - mean) / std
            with torch.autocast("cuda", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(x), labels[rows])
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if epoch == 0:
            check_learning("pytorch", precision, loss.item(), WARM_UP_LOSS, "after the warm-up epoch")
    check_learning("pytorch", precision, loss.item(), FINAL_LOSS, "at the end")
    print(f"pytorch {precision}: last batch loss {loss.item():.4f}")
    return times[1:]


def flops_per_epoch(samples: int, widths: list[int]) -> float:
    """Forward, weight-gradient and input-gradient GEMMs (none for the input layer): 2 flops per MAC."""
    macs = sum(a * b for a, b in zip(widths[:-1], widths[1:]))
    input_grad_macs = macs - widths[0] * widths[1]
    return 2.0 * samples * (2 * macs + input_grad_macs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=lambda s: [int(w) for w in s.split(",")], default=[512, 512])
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32", "fp16", "bf16"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from mlptrain.data import load_dataset

    dataset = load_dataset("mnist")
    widths = [dataset.train_images.shape[1], *args.hidden, dataset.num_classes]
    flops = flops_per_epoch(55000, widths)
    rows = []
    for precision in args.precisions:
        ours = statistics.median(mlptrain_epochs(dataset, args, precision))
        theirs = statistics.median(pytorch_epochs(dataset, args, precision))
        workload = f"MLP {'-'.join(map(str, widths))}, batch {args.batch_size}, Adam, {precision}"
        rows.append({"workload": workload, "mlptrain_s": ours, "pytorch_s": theirs, "speedup": theirs / ours,
                     "epochs_timed": args.epochs})
    print()
    print("| workload | mlptrain s/epoch | PyTorch eager s/epoch | speed-up | mlptrain TFLOP/s | PyTorch TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['workload']} | {r['mlptrain_s']:.4f} | {r['pytorch_s']:.4f} | {r['speedup']:.2f}x | "
              f"{flops / r['mlptrain_s'] / 1e12:.2f} | {flops / r['pytorch_s'] / 1e12:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
