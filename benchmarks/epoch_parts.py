"""Where an MNIST MLP epoch's wall time goes on the host: the parts of `train_epoch`, timed as they run.

Builds a run of adam_mnist's shape (Adam lr 1e-3, --hidden, --batch-size, --precision) and trains --epochs epochs,
each between two synchronisations, as benchmarks/mlp_mnist.py times them. The parts: the epoch's order
(training.loop.epoch_order), its copy to the device (TrainingWindow.start_epoch), the full windows (graph replays
on a GPU), the partial last window, the queued reads and their reports (which wait for the device). The table
gives each part's host ms an epoch (the mean over the epochs after the first two, which compile and capture)
beside the median wall of those epochs. On a GPU, a part the GPU waits for (the order, made before anything is
queued) adds to the wall; one made while queued windows run does not. The training loss must have fallen
below LOSS_LIMIT by the end, else the script exits 1.

    python benchmarks/epoch_parts.py [--precision fp32] [--batch-size 2048] [--hidden 128,128] [--epochs 8]
                                     [--backend cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path

LOSS_LIMIT = 1.0  # ln 10 = 2.30 at chance; one epoch of Adam 1e-3 ends near 0.1 at batch 128, 0.5 at 2048
WARM_EPOCHS = 2  # the first compiles the kernels and captures the graphs; the second's order was made the old way


def timed(parts: dict, name: str, function):
    """`function`, adding each call's host seconds and count under `name` in `parts`."""
    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            parts[name][0] += time.perf_counter() - start
            parts[name][1] += 1
    return wrapped


def measure(args) -> dict:
    from mlptrain.backends.selection import get_backend
    from mlptrain.config.load import config_from_dict
    from mlptrain.data import load_dataset
    from mlptrain.training import loop
    from mlptrain.training.session import build_session

    config = config_from_dict({"backend": args.backend, "seed": 0, "model": {"hidden": args.hidden},
                               "optim": {"name": "adam", "lr": 1e-3},
                               "train": {"batch_size": args.batch_size, "epochs": args.epochs,
                                         "precision": args.precision}})
    backend = get_backend(args.backend)
    session = build_session(config, backend, load_dataset("mnist"))
    parts = collections.defaultdict(lambda: [0.0, 0])
    # the loop's module globals and the window's methods, wrapped: what each costs the host as the loop runs
    loop.epoch_order = timed(parts, "order (epoch_order)", loop.epoch_order)
    loop.queue_read = timed(parts, "reads queued", loop.queue_read)
    loop.report = timed(parts, "reads reported (waiting for the device)", loop.report)
    window = session.window
    window.start_epoch = timed(parts, "order copied (start_epoch)", window.start_epoch)
    full = timed(parts, "full windows", window.run)
    partial = timed(parts, "partial window", window.run)
    window.run = lambda start, rows: (full if rows == window.full_rows else partial)(start, rows)
    walls, reads = [], []
    for epoch in range(1, args.epochs + 1):
        backend.synchronize()
        if epoch == WARM_EPOCHS + 1:
            parts.clear()
        start = time.perf_counter()
        loop.train_epoch(session, epoch, reads.append)
        backend.synchronize()
        walls.append(time.perf_counter() - start)
    if not reads[-1]["loss"] < LOSS_LIMIT:  # `not <`: NaN fails too
        raise SystemExit(f"WRONG RESULT: training loss {reads[-1]['loss']:.4g} at the end is not below "
                         f"{LOSS_LIMIT:g}; nothing is reported")
    timed_epochs = args.epochs - WARM_EPOCHS
    return {"precision": args.precision, "batch_size": args.batch_size, "hidden": args.hidden,
            "backend": backend.name, "device": backend.device_name, "epochs_timed": timed_epochs,
            "wall_ms": statistics.median(walls[WARM_EPOCHS:]) * 1e3, "loss": reads[-1]["loss"],
            "parts": {name: {"ms": seconds / timed_epochs * 1e3, "calls": calls / timed_epochs}
                      for name, (seconds, calls) in parts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--hidden", type=lambda s: [int(w) for w in s.split(",")], default=[128, 128])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.epochs <= WARM_EPOCHS:
        raise SystemExit(f"--epochs must be more than the {WARM_EPOCHS} warm-up epochs")
    result = measure(args)
    print(f"\nMLP 784-{'-'.join(map(str, args.hidden))}-10, batch {args.batch_size}, {args.precision}, "
          f"{result['device']}: epoch wall {result['wall_ms']:.2f} ms (median of {result['epochs_timed']}); "
          f"final loss {result['loss']:.4f}")
    print("| part | host ms an epoch | calls an epoch |")
    print("| --- | --- | --- |")
    for name, part in result["parts"].items():
        print(f"| {name} | {part['ms']:.3f} | {part['calls']:g} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
