"""Our GEMM kernels against cuBLAS (through PyTorch), on one GPU, in one run.

For each shape and product (forward NN with bias + ReLU, backward-input NT
with ReLU', backward-weight TN), it first checks our result against a float64
product computed on the GPU, then times ours and cuBLAS's plain fp32 matmul
(TF32 off) of the same shape. Timing: CUDA events around `--inner` launches
queued behind a short sleep kernel (so host launch overhead stays out of the
figure: this is GPU time per launch), after a warm-up; the median of
`--repeats` such measurements. `--tiles` also times every candidate
(BM, BN, BK, TM, TN, KSPLIT) tile, forced: the measurements behind the
LARGE / MEDIUM / SMALL tiles and their thresholds in gemm.py.

    python benchmarks/gemm.py [--repeats 15] [--inner 20] [--tiles] [--json FILE]

Shapes are (M, K, N) of the layer: x (M, K), w (K, N), y (M, N).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SHAPES = [(4096, 4096, 4096), (128, 784, 512), (128, 512, 512), (128, 512, 10), (2048, 784, 128), (2048, 128, 128)]
OPS = ["forward", "backward_input", "backward_weight"]
# Candidate (BM, BN, BK, TM, TN, KSPLIT) tiles and extra
# cuda.jit options, timed forced with --tiles.
CANDIDATES = [
    ((128, 128, 8, 8, 8, 1), {}),
    ((128, 128, 16, 8, 8, 1), {}),
    ((128, 64, 16, 8, 4, 1), {}),
    ((128, 64, 8, 8, 4, 1), {}),
    ((64, 128, 8, 4, 8, 1), {}),
    ((64, 64, 16, 4, 4, 1), {}),
    ((64, 64, 8, 4, 4, 2), {}),
    ((32, 32, 16, 4, 4, 4), {}),
    ((32, 64, 16, 4, 4, 2), {}),
    ((32, 32, 8, 4, 4, 8), {}),
    ((32, 32, 16, 2, 2, 1), {}),
]


def make_inputs(torch, op, m, k, n, seed=0):
    """Device tensors for one product and the float64 expected output."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, device="cuda", dtype=torch.float32)  # noqa: E731
    if op == "forward":
        x, w, b = rand(m, k), rand(k, n), rand(n)
        expected = torch.relu(x.double() @ w.double() + b.double())
        bound = (x.double().abs() @ w.double().abs() + b.double().abs()) * 2e-6 * k**0.5 + 1e-6
        return dict(x=x, w=w, b=b, out=torch.empty(m, n, device="cuda")), expected, bound
    if op == "backward_input":
        dy, w, h = rand(m, n), rand(k, n), torch.relu(rand(m, k))
        expected = (dy.double() @ w.double().T) * (h > 0).double()
        bound = (dy.double().abs() @ w.double().abs().T) * 2e-6 * n**0.5 + 1e-6
        return dict(dy=dy, w=w, h=h, out=torch.empty(m, k, device="cuda")), expected, bound
    x, dy = rand(m, k), rand(m, n)
    expected = x.double().T @ dy.double()
    bound = (x.double().abs().T @ dy.double().abs()) * 2e-6 * m**0.5 + 1e-6
    return dict(x=x, dy=dy, out=torch.empty(k, n, device="cuda")), expected, bound


_KERNELS = {}


def our_launch(cuda, gemm, op, t, candidate=None):
    """A no-argument launch of our kernel; `candidate` forces (tile, jit options)."""
    a = {name: cuda.as_cuda_array(v) for name, v in t.items()}
    if candidate is None:
        if op == "forward":
            return lambda: gemm.linear_forward(a["x"], a["w"], a["b"], a["out"], 1)
        if op == "backward_input":
            return lambda: gemm.linear_backward_input(a["dy"], a["w"], a["h"], a["out"], 1)
        (m, k), n = a["x"].shape, a["dy"].shape[1]
        workspace = cuda.device_array(max(1, gemm.linear_backward_weight_workspace(m, k, n)), np.float32)
        return lambda: gemm.linear_backward_weight(a["x"], a["dy"], a["out"], 0.0, workspace)
    from mlptrain.backends.numba_kernels import tiles  # main() imports it only for itself

    factory = {"forward": lambda tile, dtype, **o: gemm.make_linear_rows(tile, dtype, False, **o),
               "backward_input": lambda tile, dtype, **o: gemm.make_linear_rows(tile, dtype, True, **o),
               "backward_weight": gemm.make_linear_backward_weight}[op]
    tile, options = candidate
    key = (op, tile, tuple(sorted(options.items())))
    if key not in _KERNELS:  # one compilation per candidate, not per shape
        _KERNELS[key] = factory(tile, np.dtype(np.float32), **options)
    kernel = _KERNELS[key]
    rows, columns = a["out"].shape
    grid, threads = tiles.launch_grid(rows, columns, tile)
    if op == "forward":
        return lambda: kernel[grid, threads](a["x"], a["w"], a["b"], a["out"], 1)
    if op == "backward_input":
        return lambda: kernel[grid, threads](a["dy"], a["w"], a["h"], a["out"], 1)
    return lambda: kernel[grid, threads](a["x"], a["dy"], a["out"], np.float32(0))


def cublas_launch(torch, op, t):
    if op == "forward":
        return lambda: torch.matmul(t["x"], t["w"], out=t["out"])
    if op == "backward_input":
        return lambda: torch.matmul(t["dy"], t["w"].T, out=t["out"])
    return lambda: torch.matmul(t["x"].T, t["dy"], out=t["out"])


def gpu_ms(cuda, sleep, launch, repeats, inner):
    """Median GPU ms per launch; launches queue behind a sleep kernel, so
    the GPU runs them back to back whatever the host launch cost."""
    for _ in range(3):
        launch()
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(inner):
        launch()
    queueing = time.perf_counter() - t0
    cuda.synchronize()
    rounds = max(40, math.ceil(2 * queueing / 100e-6))  # 100 µs a round: twice the time to queue them
    start, end, times = cuda.event(), cuda.event(), []
    for _ in range(repeats):
        sleep[1, 1](rounds)
        start.record()
        for _ in range(inner):
            launch()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) / inner)
    return statistics.median(times)


def check(t, expected, bound):
    error = (t["out"].double() - expected).abs()
    bad = ~(error <= bound)
    return not bool(bad.any()), float((error / bound).max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument("--tiles", action="store_true", help="also time every candidate tile, forced")
    parser.add_argument("--tile", action="append", default=[],
                        help="time only these candidates (BMxBNxBKxTMxTNxKSPLIT; repeatable); implies --tiles")
    parser.add_argument("--shapes", type=lambda v: [tuple(map(int, s.split("x"))) for s in v.split(",")],
                        default=SHAPES, help="MxKxN,... (default: all of SHAPES)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")  # small grids are the point here
    import torch
    from numba import cuda

    from mlptrain.backends.numba_kernels import gemm

    torch.backends.cuda.matmul.allow_tf32 = False

    @cuda.jit
    def sleep(rounds):
        for _ in range(rounds):
            cuda.nanosleep(100000)

    rows, failed = [], False
    candidates = [c for c in CANDIDATES if not args.tile or "x".join(map(str, c[0])) in args.tile]
    args.tiles = args.tiles or bool(args.tile)
    for m, k, n in args.shapes:
        big = m * k * n >= 4096**3
        repeats, inner = (max(3, args.repeats // 3), 3) if big else (args.repeats, args.inner)
        for op in OPS:
            t, expected, bound = make_inputs(torch, op, m, k, n)
            versions = [("ours", None)]
            if args.tiles:
                versions += [(" ".join(["x".join(map(str, c[0]))] + [f"{k}={v}" for k, v in c[1].items()]), c)
                             for c in candidates]
            t["out"].fill_(float("nan"))
            cublas = gpu_ms(cuda, sleep, cublas_launch(torch, op, t), repeats, inner)
            for name, candidate in versions:
                t["out"].fill_(float("nan"))
                launch = our_launch(cuda, gemm, op, t, candidate)
                launch()
                cuda.synchronize()
                ok, worst = check(t, expected, bound)
                failed |= not ok
                ms = gpu_ms(cuda, sleep, launch, repeats, inner) if ok else float("nan")
                flops = 2.0 * m * k * n
                rows.append(dict(shape=f"{m}x{k}x{n}", op=op, version=name, check="ok" if ok else "FAIL",
                                 worst_error_over_bound=worst, ours_ms=ms, cublas_ms=cublas,
                                 ours_tflops=flops / ms / 1e9, cublas_tflops=flops / cublas / 1e9,
                                 ours_over_cublas=ms / cublas))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    print(f"\n{torch.cuda.get_device_name()}; ms = GPU time per launch (median); ratio = ours / cuBLAS time\n")
    print("| shape MxKxN | product | version | check | ours ms | cuBLAS ms | ours TFLOP/s | cuBLAS TFLOP/s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['shape']} | {r['op']} | {r['version']} | {r['check']} | {r['ours_ms']:.4f} | "
              f"{r['cublas_ms']:.4f} | {r['ours_tflops']:.2f} | {r['cublas_tflops']:.2f} | "
              f"{r['ours_over_cublas']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
