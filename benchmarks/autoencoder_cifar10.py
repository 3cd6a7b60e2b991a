"""Training images/s of the CIFAR-10 convolutional autoencoder: mlptrain against PyTorch (cuDNN), one GPU, one run.

Both train the model of `configs/autoencoder_cifar10.yaml` (conv3x3 3-256-128 + ReLU + maxpool, mirrored
decoder with nearest 2x upsampling, MSE on pixels / 255) with Adam (lr 1e-3) on the CIFAR-10 training
images found under $MLPTRAIN_DATA_DIR (the shared subset: 4,585 after the validation split), the whole
set resident on the GPU as uint8 and each batch gathered and scaled on the device. mlptrain runs its own
optimizer steps (`mlptrain.training.window.TrainingWindow.run`); PyTorch the eager loop with fused Adam, cuDNN
autotuning on, TF32 off, with autocast (+ GradScaler for fp16) for the mixed-precision rows, in both memory
layouts: NCHW and channels_last (cuDNN's fastest for 16-bit convolutions); the ratio is to the faster of the
two. Each is warmed up for one
epoch, then timed over --epochs epochs; the table shows the median epoch's images/s. A tool whose
MSE is not finite after the warm-up epoch, or not below FINAL_MSE at the end (an output near zero
scores about 0.28, the mean image about 0.06), stops the script with exit code 1: no speed is
reported for a model that does not learn.

    python benchmarks/autoencoder_cifar10.py [--epochs 5] [--batch-sizes 64,256] [--precisions fp32] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

CHANNELS = [256, 128]
FINAL_MSE = 0.2  # an untrained model's output near 0 scores about 0.28 (the mean squared pixel); 8-channel
# layers reach 0.13 after 36 steps at batch 256 on the CPU


def check_learning(tool: str, batch: int, precision: str, mse: float, limit: float, when: str) -> None:
    """Exit 1 when `mse` is not finite or not below `limit`."""
    if not mse < limit:  # `not <`: NaN fails too
        raise SystemExit(f"WRONG RESULT: {tool} batch {batch} {precision}: training MSE {mse:.4g} {when} is "
                         f"not below {limit:g}; nothing is reported")


def flops_per_image(channels=CHANNELS, side=32, kernel=3) -> float:
    """Forward + input-gradient + weight-gradient convolutions (2 flops per MAC; the first layer's input
    gradient is never computed)."""
    from mlptrain.nn.autoencoder import autoencoder_convs

    convs = autoencoder_convs(list(channels))
    depth = len(channels)
    # spatial side of each convolution: halved after each encoder conv, doubled after each decoder conv but the last
    sides = [side >> i for i in range(depth)] + [side >> (depth - i) for i in range(depth + 1)]
    macs = [kernel * kernel * cin * cout * n * n for (cin, cout), n in zip(convs, sides)]
    return 2.0 * (3 * sum(macs) - macs[0])


def mlptrain_rates(dataset, args, batch, precision) -> list[float]:
    from mlptrain.backends.selection import get_backend
    from mlptrain.config.load import config_from_dict
    from mlptrain.data.loader import epoch_order
    from mlptrain.training.session import build_session

    config = config_from_dict({
        "backend": "cuda", "seed": 0, "data": {"dataset": "cifar10", "val_size": 500},
        "model": {"type": "conv_autoencoder", "channels": CHANNELS},
        "optim": {"name": "adam", "lr": 1e-3},
        "train": {"batch_size": batch, "eval_batch_size": batch, "epochs": args.epochs + 1, "precision": precision},
    })
    backend = get_backend("cuda")
    s = build_session(config, backend, dataset)
    rates = []
    for epoch in range(args.epochs + 1):
        backend.copy_from_host(s.window.order, epoch_order(s.train, config.seed, epoch + 1))
        backend.synchronize()
        t0 = time.perf_counter()
        for start in range(0, s.train.size, batch):
            s.window.run(start, min(batch, s.train.size - start))
        backend.synchronize()
        rates.append(s.train.size / (time.perf_counter() - t0))
        loss = float(backend.to_host(s.window.row_loss).astype(np.float64).mean())  # this epoch's mean
        if epoch == 0:
            check_learning("mlptrain", batch, precision, loss, float("inf"), "after the warm-up epoch")
    check_learning("mlptrain", batch, precision, loss, FINAL_MSE, "in the last epoch")
    print(f"mlptrain batch {batch} {precision}: last epoch's mean MSE {loss:.4f}")
    return rates[1:]


def pytorch_rates(dataset, args, batch, precision, channels_last=False) -> list[float]:
    import torch
    from torch import nn

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    device = torch.device("cuda")
    n = len(dataset.train_images) - 500
    images = torch.tensor(dataset.train_images[:n], device=device).view(n, 3, 32, 32)
    c1, c2 = CHANNELS
    model = nn.Sequential(
        nn.Conv2d(3, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c2, c2, 3, padding=1), nn.ReLU(), nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(c2, c1, 3, padding=1), nn.ReLU(), nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(c1, 3, 3, padding=1),
    ).to(device)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=layout)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    rates = []
    for epoch in range(args.epochs + 1):
        generator = torch.Generator(device=device).manual_seed(epoch)
        order = torch.randperm(n, device=device, generator=generator)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            x = (images[order[start:start + batch]].float() / 255.0).contiguous(memory_format=layout)
            with torch.autocast("cuda", dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                loss = nn.functional.mse_loss(model(x), x)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        torch.cuda.synchronize()
        rates.append(n / (time.perf_counter() - t0))
        if epoch == 0:
            check_learning("pytorch", batch, precision, loss.item(), float("inf"), "after the warm-up epoch")
    check_learning("pytorch", batch, precision, loss.item(), FINAL_MSE, "at the last batch")
    print(f"pytorch batch {batch} {precision}{' channels_last' if channels_last else ''}: last batch MSE "
          f"{loss.item():.4f}")
    return rates[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-sizes", type=lambda s: [int(b) for b in s.split(",")], default=[64, 256])
    parser.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from mlptrain.data import load_dataset

    dataset = load_dataset("cifar10")
    flops = flops_per_image()
    rows = []
    for precision in args.precisions:
        for batch in args.batch_sizes:
            ours = statistics.median(mlptrain_rates(dataset, args, batch, precision))
            nchw = statistics.median(pytorch_rates(dataset, args, batch, precision))
            last = statistics.median(pytorch_rates(dataset, args, batch, precision, channels_last=True))
            rows.append({"workload": f"CIFAR autoencoder, batch {batch}, Adam, {precision}",
                         "mlptrain_images_per_s": ours, "pytorch_nchw_images_per_s": nchw,
                         "pytorch_channels_last_images_per_s": last, "ratio": ours / max(nchw, last),
                         "epochs_timed": args.epochs})
    print()
    print("| workload | mlptrain images/s | PyTorch NCHW images/s | PyTorch channels_last images/s | ratio to the "
          "faster | mlptrain TFLOP/s | PyTorch's faster TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        best = max(r["pytorch_nchw_images_per_s"], r["pytorch_channels_last_images_per_s"])
        print(f"| {r['workload']} | {r['mlptrain_images_per_s']:,.0f} | {r['pytorch_nchw_images_per_s']:,.0f} | "
              f"{r['pytorch_channels_last_images_per_s']:,.0f} | {r['ratio']:.2f}x | "
              f"{r['mlptrain_images_per_s'] * flops / 1e12:.1f} | {best * flops / 1e12:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
