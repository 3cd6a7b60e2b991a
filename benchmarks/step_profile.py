"""GPU time of each launcher in one training step of the autoencoder or an MLP (CUDA backend): where a step's
time goes.

Every launcher of `mlptrain.backends.numba_kernels` is wrapped so that CUDA events bracket its launches; the step
is queued behind a sleep kernel, so the GPU runs its kernels back to back whatever the host's launch
cost, and each event pair times the GPU work of one call. Calls made inside another launcher count in
the outer one. One table: each call (launcher and shapes), its median ms over --repeats steps after a
warm-up, TFLOP/s for the convolutions, and the step's total beside the sum of its calls. The events add
a little GPU time a call, so the step here is a little longer than a captured one.

    python benchmarks/step_profile.py [--model autoencoder|mlp] [--batch 256] [--hidden 512,512]
                                      [--precision fp32] [--repeats 10] [--json FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

CHANNELS = [256, 128]


def conv_flops(name, arrays):
    """Flops of a convolution or dense-layer pass from its arguments' shapes (2 per multiply-add), else None."""
    if name.startswith("gemm.linear_"):
        (a0, a1), b = arrays[0].shape, arrays[1].shape
        # forward x (M, K) @ w (K, N); input gradient dy (M, N) @ w.T (w (K, N)); weight x (B, K).T @ dy (B, N)
        return 2.0 * a0 * a1 * (b[0] if name.endswith("backward_input") else b[1])
    if not name.startswith("conv.conv2d_"):
        return None
    shapes = [a.shape for a in arrays if len(a.shape) == 4]
    image = shapes[0]
    kernel = next(s for s in shapes if s[0] == s[1] and s[0] != image[1])
    return 2.0 * image[0] * image[1] * image[2] * kernel[0] * kernel[1] * kernel[2] * kernel[3]


def instrument(kernels, cuda, records):
    """Wraps every public function of the kernel modules; returns a function that undoes it."""
    depth = [0]
    originals = []
    for module_name in kernels.__all__:
        module = getattr(kernels, module_name)
        for attr in dir(module):
            fn = getattr(module, attr)
            if attr.startswith("_") or not callable(fn) or getattr(fn, "__module__", None) != module.__name__:
                continue
            if isinstance(fn, type) or hasattr(fn, "py_func"):
                continue

            def wrapped(*args, _fn=fn, _name=f"{module_name}.{attr}", **kwargs):
                if depth[0]:
                    return _fn(*args, **kwargs)
                arrays = [a for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
                start, end = cuda.event(), cuda.event()
                depth[0] += 1
                try:
                    start.record()
                    result = _fn(*args, **kwargs)
                    end.record()
                finally:
                    depth[0] -= 1
                label = f"{_name} " + " ".join("x".join(map(str, a.shape)) for a in arrays[:2])
                records.append((label, start, end, conv_flops(_name, arrays)))
                return result

            originals.append((module, attr, fn))
            setattr(module, attr, functools.wraps(fn)(wrapped))

    def undo():
        for module, attr, fn in originals:
            setattr(module, attr, fn)

    return undo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["autoencoder", "mlp"], default="autoencoder")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=lambda s: [int(w) for w in s.split(",")], default=[512, 512])
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from numba import cuda

    from mlptrain.backends import numba_kernels
    from mlptrain.backends.selection import get_backend
    from mlptrain.config.load import config_from_dict
    from mlptrain.data import load_dataset
    from mlptrain.data.loader import epoch_order
    from mlptrain.training.session import build_session

    autoencoder = args.model == "autoencoder"
    dataset = "cifar10" if autoencoder else "mnist"
    config = config_from_dict({
        "backend": "cuda", "seed": 0, "data": {"dataset": dataset, "val_size": 500},
        "model": {"type": "conv_autoencoder", "channels": CHANNELS} if autoencoder else {"hidden": args.hidden},
        "optim": {"name": "adam", "lr": 1e-3},
        "train": {"batch_size": args.batch, "eval_batch_size": args.batch, "epochs": 1,
                  "precision": args.precision, "cuda_graphs": False},
    })
    backend = get_backend("cuda")
    s = build_session(config, backend, load_dataset(dataset))
    backend.copy_from_host(s.window.order, epoch_order(s.train, config.seed, 1))

    @cuda.jit
    def sleep(rounds):
        for _ in range(rounds):
            cuda.nanosleep(100000)

    for _ in range(3):
        s.window.run(0, args.batch)
    backend.synchronize()
    t0 = time.perf_counter()
    s.window.run(0, args.batch)
    queueing = time.perf_counter() - t0
    backend.synchronize()
    rounds = max(40, int(2 * queueing / 100e-6))

    per_call, totals, flops = {}, [], {}
    for _ in range(args.repeats):
        records = []
        undo = instrument(numba_kernels, cuda, records)
        try:
            sleep[1, 1](rounds)
            first, last = cuda.event(), cuda.event()
            first.record()
            s.window.run(0, args.batch)
            last.record()
            last.synchronize()
        finally:
            undo()
        totals.append(cuda.event_elapsed_time(first, last))
        seen = {}
        for label, start, end, f in records:
            seen[label] = seen.get(label, 0) + 1
            key = f"{label} #{seen[label]}" if seen[label] > 1 else label
            per_call.setdefault(key, []).append(cuda.event_elapsed_time(start, end))
            flops[key] = f

    rows = [{"call": k, "ms": statistics.median(v), "tflops": flops[k] / statistics.median(v) / 1e9 if flops[k] else None}
            for k, v in per_call.items()]
    step = statistics.median(totals)
    model = f"autoencoder {CHANNELS}" if autoencoder else f"MLP 784-{'-'.join(map(str, args.hidden))}-10"
    print(f"\n{model}, batch {args.batch}, {args.precision}: step {step:.3f} ms GPU "
          f"(sum of calls {sum(r['ms'] for r in rows):.3f} ms; {args.batch / step * 1e3:,.0f} images/s; "
          f"{len(rows)} launcher calls)")
    print("| call | µs | share | TFLOP/s |")
    print("| --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: -r["ms"]):
        tf = f"{r['tflops']:.1f}" if r["tflops"] else ""
        print(f"| {r['call']} | {r['ms'] * 1e3:.1f} | {r['ms'] / step:.1%} | {tf} |")
    if args.json:
        args.json.write_text(json.dumps({"step_ms": step, "calls": rows}, indent=2))


if __name__ == "__main__":
    main()
