"""The built-in configs' recipes written in plain PyTorch, each a whole process, for benchmarks/e2e.py.

    python benchmarks/torch_recipes.py adam_mnist --mode eager|graphs --data DIR [--seed S] [--epochs E]
    python benchmarks/torch_recipes.py autoencoder_cifar10 --mode eager|channels_last --data DIR [--seed S] [--epochs E]

Same recipe as `configs/<job>.yaml`: adam_mnist is the 784-512-512-10 ReLU MLP, Adam lr 1e-3
cosine-annealed per step to 0, batch 128, 10 epochs, 5,000 training images held out for validation;
autoencoder_cifar10 the conv3x3 3-256-128 encoder (ReLU, 2x2 max-pool) and mirrored decoder (ReLU,
nearest 2x upsample, a linear 256 -> 3 conv), MSE on pixels / 255, Adam lr 1e-3 cosine, batch 64, 20
epochs, 500 held out. Both evaluate validation and test after every epoch, as mlptrain does (mlptrain
also writes checkpoints and TensorBoard events, which these do not). PyTorch's default initialisation.
The whole dataset is resident on the GPU; each batch is gathered from a shuffled index on the device.
`--seed S` (default 0) seeds PyTorch (initialisation, data order) and holds out the same validation
images as `mlptrain run ... seed=S` (mlptrain.data.loader.resident_splits' permutation).

Modes: `eager` is the plain loop; `graphs` (MLP) captures forward, backward and the optimizer step
(capturable Adam, lr as a device tensor) in one CUDA graph and replays it; `channels_last` (the
autoencoder) is what a speed-minded cuDNN user writes: NHWC tensors, cuDNN autotuning and fused Adam.
TF32 stays off everywhere (mlptrain computes in float32). Prints one JSON line of results.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import math
import pickle
import time
from pathlib import Path

import numpy as np


@functools.lru_cache(maxsize=1)  # a sweep's worker trains many trials on the same data (sweep_peer.py)
def read_mnist(root: Path):
    def idx(name, offset):
        with gzip.open(root / "mnist" / name) as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)
    train = idx("train-images-idx3-ubyte.gz", 16).reshape(-1, 784)
    test = idx("t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784)
    return train, idx("train-labels-idx1-ubyte.gz", 8), test, idx("t10k-labels-idx1-ubyte.gz", 8)


@functools.lru_cache(maxsize=1)
def read_cifar(root: Path):
    folder = root / "cifar10" / "cifar-10-batches-py"
    if not folder.is_dir():
        folder = root / "cifar10-subset" / "cifar-10-batches-py"

    def batch(name):
        with open(folder / name, "rb") as f:
            data = pickle.load(f, encoding="bytes")[b"data"]
        return np.asarray(data, np.uint8).reshape(-1, 3, 32, 32)
    return np.concatenate([batch(f"data_batch_{i}") for i in range(1, 6)]), batch("test_batch")


def cosine(step, total, lr=1e-3):
    return 0.5 * lr * (1 + math.cos(math.pi * step / total))


def split(n, val, seed):
    """(train, val) rows as mlptrain holds them out for `seed` (mlptrain.data.loader.resident_splits)."""
    order = np.random.default_rng([seed, 0x5EED]).permutation(n)
    return np.sort(order[val:]), np.sort(order[:val])


def mnist(args, torch):
    nn = torch.nn
    x_all, y_all, x_test, y_test = read_mnist(args.data)
    train_idx, val_idx = split(len(x_all), 5000, args.seed)
    dev = torch.device("cuda")
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
    x_train, y_train, x_val, y_val = to(x_all[train_idx]), to(y_all[train_idx]).long(), to(x_all[val_idx]), to(y_all[val_idx]).long()
    x_test, y_test = to(x_test), to(y_test).long()
    norm = lambda x: (x.float() / 255 - 0.1307) / 0.3081  # noqa: E731
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(dev)
    batch, epochs, n = 128, args.epochs or 10, len(train_idx)
    steps = math.ceil(n / batch)
    total = epochs * steps
    graphs = args.mode == "graphs"
    lr = torch.tensor(1e-3, device=dev) if graphs else 1e-3
    opt = torch.optim.Adam(model.parameters(), lr=lr, capturable=graphs)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = loss_fn(model(norm(x)), y)
        loss.backward()
        opt.step()
        return loss

    static_x, static_y, graph = torch.empty(batch, 784, dtype=torch.uint8, device=dev), torch.empty(batch, dtype=torch.long, device=dev), None
    t = 0
    for epoch in range(epochs):
        order = torch.randperm(n, device=dev)
        for i in range(steps):
            idx = order[i * batch:(i + 1) * batch]
            new_lr = cosine(t, total)
            if not graphs:
                for group in opt.param_groups:
                    group["lr"] = new_lr
                step(x_train[idx], y_train[idx])
            else:
                opt.param_groups[0]["lr"].fill_(new_lr)
                if len(idx) < batch:  # the epoch's last, shorter batch runs eagerly
                    step(x_train[idx], y_train[idx])
                elif graph is None and t < 3:  # warm up on a side stream before capture, as the docs ask
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        step(x_train[idx], y_train[idx])
                    torch.cuda.current_stream().wait_stream(side)
                else:
                    torch.index_select(x_train, 0, idx, out=static_x)
                    torch.index_select(y_train, 0, idx, out=static_y)
                    if graph is None:
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            step(static_x, static_y)
                    graph.replay()
            t += 1
        val_acc, test_acc = (evaluate_classifier(torch, model, norm, x, y) for x, y in ((x_val, y_val), (x_test, y_test)))
    return {"val_acc": val_acc, "test_acc": test_acc}


def evaluate_classifier(torch, model, norm, x, y):
    with torch.no_grad():
        hits = sum(int((model(norm(x[i:i + 1000])).argmax(1) == y[i:i + 1000]).sum()) for i in range(0, len(x), 1000))
    return hits / len(x)


def autoencoder(args, torch):
    nn = torch.nn
    x_all, x_test = read_cifar(args.data)
    train_idx, val_idx = split(len(x_all), 500, args.seed)
    dev = torch.device("cuda")
    fmt = torch.channels_last if args.mode == "channels_last" else torch.contiguous_format
    torch.backends.cudnn.benchmark = args.mode == "channels_last"
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
    x_train, x_val, x_test = to(x_all[train_idx]), to(x_all[val_idx]), to(x_test)
    conv = lambda i, o: nn.Conv2d(i, o, 3, padding=1)  # noqa: E731
    model = nn.Sequential(conv(3, 256), nn.ReLU(), nn.MaxPool2d(2), conv(256, 128), nn.ReLU(), nn.MaxPool2d(2),
                          conv(128, 128), nn.ReLU(), nn.Upsample(scale_factor=2), conv(128, 256), nn.ReLU(),
                          nn.Upsample(scale_factor=2), conv(256, 3)).to(dev).to(memory_format=fmt)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=args.mode == "channels_last")
    batch, epochs, n = 64, args.epochs or 20, len(train_idx)
    steps = math.ceil(n / batch)
    total, t = epochs * steps, 0
    prep = lambda x: (x.float() / 255).contiguous(memory_format=fmt)  # noqa: E731
    for epoch in range(epochs):
        order = torch.randperm(n, device=dev)
        for i in range(steps):
            x = prep(x_train[order[i * batch:(i + 1) * batch]])
            for group in opt.param_groups:
                group["lr"] = cosine(t, total)
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), x).backward()
            opt.step()
            t += 1
        with torch.no_grad():
            val_mse, test_mse = (sum(float(nn.functional.mse_loss(model(prep(x[i:i + 256])), prep(x[i:i + 256]),
                                                                   reduction="sum")) for i in range(0, len(x), 256))
                                 / x[:, :, :, :].numel() for x in (x_val, x_test))
    return {"val_mse": val_mse, "test_mse": test_mse}


def main():
    started = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=["adam_mnist", "autoencoder_cifar10"])
    parser.add_argument("--mode", default="eager", choices=["eager", "graphs", "channels_last"])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0, help="PyTorch's seed and the validation split's")
    parser.add_argument("--epochs", type=int, default=None, help="the recipe's own (10, 20) unless given")
    args = parser.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    result = (mnist if args.job == "adam_mnist" else autoencoder)(args, torch)
    torch.cuda.synchronize()
    result.update(job=args.job, mode=args.mode, seed=args.seed, train_s=time.perf_counter() - t0, in_process_s=time.perf_counter() - started)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
