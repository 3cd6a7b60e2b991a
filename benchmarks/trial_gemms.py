"""The dense GEMMs of K packed MLP trials' training step: what a trial axis inside the kernels buys.

One step of a 784-512-512-10 MLP at batch 128 runs eight GEMMs per trial (three forward with bias and
ReLU, two input gradients with ReLU's derivative, three weight gradients). For K trials, timed as one CUDA
graph replay per step after a warm-up, the median of --repeats runs of --steps steps:

    serial      each trial's eight launches captured as its own graph, the K graphs replayed one after
                another on one stream (a one-worker sweep's GEMMs)
    streams     the same K graphs, each replayed on a stream of its own (today's `--pack K`)
    trial axis  eight launches for all K trials, each with the trial axis as the grid's third dimension
                (block z computes trial z's tile; the tile chosen for all the trials' blocks together)
    tf32x3      the trial axis on the tf32x3 engine (float32 products on tensor cores at float32 accuracy,
                gemm_tf32.py), for each --tf32-tiles tile and --tf32-stages depth (cp.async copies that many
                slices deep, gemm_async.py; 0 staged through registers); and trial 0 alone on it, its time
                counted K times
    cuBLAS      torch.bmm over the K trials (cuBLAS's strided-batched SGEMM, TF32 off), the same eight
                products without bias or activation, in one torch CUDA graph: what the vendor's GEMMs take

Before timing, every mlptrain variant's outputs for the first and last trial are checked against a float64
NumPy reference (and cuBLAS's against the same); a wrong result exits 1. The table: microseconds per step
for all K trials, the GEMMs' TFLOP/s, and each row against `serial`.

    python benchmarks/trial_gemms.py [--trials 16] [--widths 784,512,512,10] [--batch 128] [--steps 200]
                                     [--tf32-tiles 64x64x2x2x16] [--tf32-stages 0,3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

RELU, NONE = 1, 0


def layer_shapes(widths, batch):
    return [(batch, a, b) for a, b in zip(widths[:-1], widths[1:])]


def flops(widths, batch):
    """Multiply-adds x 2 of the eight products: forward and weight gradient of every layer, input gradient
    of every layer but the first."""
    layers = list(zip(widths[:-1], widths[1:]))
    return 2 * batch * (2 * sum(a * b for a, b in layers) + sum(a * b for a, b in layers[1:]))


class Buffers:
    """The K trials' operands as stacked (K, ...) host arrays and their device copies."""

    def __init__(self, backend, widths, batch, trials, rng):
        def rand(*shape):
            return (rng.standard_normal((trials, *shape)) * 0.1).astype(np.float32)

        self.host = {"h0": rand(batch, widths[0])}
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]), start=1):
            self.host[f"w{i}"], self.host[f"b{i}"] = rand(a, b), rand(b)
            self.host[f"dy{i}"] = rand(batch, b)  # the gradient reaching layer i's output
        self.dev = {name: backend.to_device(a) for name, a in self.host.items()}
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]), start=1):
            self.dev[f"h{i}"] = backend.empty((trials, batch, b))
            self.dev[f"dw{i}"] = backend.empty((trials, a, b))
            if i > 1:
                self.dev[f"dx{i}"] = backend.empty((trials, batch, a))
        self.layers = len(widths) - 1

    def trial(self, t):
        """Trial t's own 2-D views of the stacked device arrays."""
        return {name: a[t:t + 1].reshape(a.shape[1:]) for name, a in self.dev.items()}


def step(gemm, arrays, layers, engine="fma"):
    """The eight launches of one step on `arrays` (one trial's 2-D views, or every trial's stacked arrays).
    The input gradients read the forward's outputs as h (ReLU's derivative) and write dx; each layer's
    weight gradient reads its stored output gradient dy: fixed operands, so every replay does the same."""
    for i in range(1, layers + 1):
        gemm.linear_forward(arrays[f"h{i - 1}"], arrays[f"w{i}"], arrays[f"b{i}"], arrays[f"h{i}"],
                            RELU if i < layers else NONE, engine=engine)
    for i in range(layers, 0, -1):
        gemm.linear_backward_weight(arrays[f"h{i - 1}"], arrays[f"dy{i}"], arrays[f"dw{i}"], 0.0, engine=engine)
        if i > 1:
            gemm.linear_backward_input(arrays[f"dy{i}"], arrays[f"w{i}"], arrays[f"h{i - 1}"], arrays[f"dx{i}"], RELU,
                                       engine=engine)


def check(name, got, host, t, layers):
    """Each of trial t's GEMM outputs against float64 products of the operands it read (the layers' outputs
    as computed, so one pass's rounding is not charged to the next), within 1e-5 of each output's sum of
    absolute terms: float32 accuracy whatever the order of the sum; a misplaced element is off by O(1)."""
    f64 = {k: v[t].astype(np.float64) for k, v in host.items()}
    h = [f64["h0"]] + [got[f"h{i}"].astype(np.float64) for i in range(1, layers + 1)]
    expected, magnitude = {}, {}
    for i in range(1, layers + 1):
        z = h[i - 1] @ f64[f"w{i}"] + f64[f"b{i}"]
        expected[f"h{i}"] = np.maximum(z, 0) if i < layers else z
        magnitude[f"h{i}"] = np.abs(h[i - 1]) @ np.abs(f64[f"w{i}"]) + np.abs(f64[f"b{i}"])
        expected[f"dw{i}"], magnitude[f"dw{i}"] = h[i - 1].T @ f64[f"dy{i}"], np.abs(h[i - 1]).T @ np.abs(f64[f"dy{i}"])
        if i > 1:
            expected[f"dx{i}"] = (f64[f"dy{i}"] @ f64[f"w{i}"].T) * (h[i - 1] > 0)
            magnitude[f"dx{i}"] = np.abs(f64[f"dy{i}"]) @ np.abs(f64[f"w{i}"]).T
    for key, want in expected.items():
        error = np.abs(got[key].astype(np.float64) - want)
        worst = np.max(error / (1e-5 * magnitude[key] + 1e-7))
        if not worst <= 1:
            sys.exit(f"WRONG RESULT: {name}, trial {t}, {key}: {worst:.3g} x the float32 bound")


def timed(run, sync, steps, repeats):
    """Median seconds per step over `repeats` runs of `steps` steps (after one warm-up run)."""
    run(steps)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(steps)
        sync()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def mlptrain_rows(args, widths, rng):
    from mlptrain.backends.numba_kernels import gemm, gemm_engines, streams
    from mlptrain.backends.selection import get_backend

    K = args.trials
    backends = [get_backend("cuda", own_stream=True) for _ in range(K)]
    main = backends[0]
    bufs = Buffers(main, widths, args.batch, K, rng)
    main.synchronize()
    layers = bufs.layers

    outputs_named = [k for k in bufs.dev if k.startswith(("dw", "dx")) or (k.startswith("h") and k != "h0")]

    def outputs(t):
        return {k: np.asarray(main.to_host(bufs.dev[k]))[t] for k in outputs_named}

    graphs = []
    for t, backend in enumerate(backends):
        streams.use(backend.stream)
        views = bufs.trial(t)
        step(gemm, views, layers)  # compiles, and fills the outputs the check reads
        graphs.append(backend.capture(lambda views=views: step(gemm, views, layers)))
    for backend in backends:
        backend.synchronize()
    for t in (0, K - 1):
        check("per-trial launches", outputs(t), bufs.host, t, layers)

    streams.use(main.stream)
    step(gemm, bufs.dev, layers)
    packed = main.capture(lambda: step(gemm, bufs.dev, layers))
    main.synchronize()
    for t in (0, K - 1):
        check("trial axis", outputs(t), bufs.host, t, layers)

    def on_streams(steps):
        for _ in range(steps):
            for g in graphs:
                g.replay()  # each on the stream it was captured from: its trial's own

    def sync_all():
        for backend in backends:
            backend.synchronize()

    # serial: the same launches captured again from the main stream, so that they replay one after another
    serial_graphs = []
    for t in range(K):
        views = bufs.trial(t)
        serial_graphs.append(main.capture(lambda views=views: step(gemm, views, layers)))

    def serial_run(steps):
        for _ in range(steps):
            for g in serial_graphs:
                g.replay()

    rows = {"serial": timed(serial_run, main.synchronize, args.steps, args.repeats),
            "streams": timed(on_streams, sync_all, args.steps, args.repeats),
            "trial axis": timed(lambda n: [packed.replay() for _ in range(n)], main.synchronize, args.steps,
                                args.repeats)}
    chosen = gemm_engines.pick_tile  # the tile the launches take (gemm_engines.engine_launch)
    for name in args.fma_tiles:  # the trial axis with one CUDA-core tile forced on every pass
        gemm_engines.pick_tile = lambda rows, columns, trials=1, name=name: name
        step(gemm, bufs.dev, layers)
        graph = main.capture(lambda: step(gemm, bufs.dev, layers))
        main.synchronize()
        for t in (0, K - 1):
            check(f"trial axis, {name} tiles", outputs(t), bufs.host, t, layers)
        rows[f"trial axis, {name} tiles forced"] = timed(lambda n, graph=graph: [graph.replay() for _ in range(n)],
                                                         main.synchronize, args.steps, args.repeats)
    gemm_engines.pick_tile = chosen
    for tile, stages in [(tile, stages) for tile in args.tf32_tiles for stages in args.tf32_stages]:
        gemm_engines.TF32_TILE, gemm_engines.TF32_STAGES = tile, stages
        ahead = f", {stages} stages" if stages else ""
        for name, arrays in ((f"trial axis, tf32x3 {tile}{ahead}", bufs.dev),
                             (f"trial 0 alone, tf32x3 {tile}{ahead}", bufs.trial(0))):
            if "alone" in name and (K == 1 or tile != args.tf32_tiles[0] or stages != args.tf32_stages[0]):
                continue  # one trial alone on the first tile only: each tile compiles six kernels
            step(gemm, arrays, layers, "tf32x3")
            graph = main.capture(lambda arrays=arrays: step(gemm, arrays, layers, "tf32x3"))
            main.synchronize()
            for t in ((0, K - 1) if "axis" in name else (0,)):
                check(name, outputs(t), bufs.host, t, layers)
            seconds = timed(lambda n, graph=graph: [graph.replay() for _ in range(n)], main.synchronize, args.steps,
                            args.repeats)
            rows[name] = seconds * (K if "alone" in name else 1)  # one trial's step, counted K times
    plan = gemm.linear_variants(args.batch, widths[0], widths[1], False, K)
    print(f"trial-axis tiles of fc1: {plan}; one trial's: {gemm.linear_variants(args.batch, widths[0], widths[1])}")
    return rows


def cublas_row(args, widths):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    K = args.trials
    gen = np.random.default_rng(args.seed)
    holder = {}

    def rand(*shape):
        return (gen.standard_normal((K, *shape)) * 0.1).astype(np.float32)

    holder["h0"] = rand(args.batch, widths[0])
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]), start=1):
        holder[f"w{i}"], holder[f"b{i}"], holder[f"dy{i}"] = rand(a, b), rand(b), rand(args.batch, b)
    t = {k: torch.from_numpy(v).cuda() for k, v in holder.items()}
    layers = len(widths) - 1
    out = {}

    def one_step():
        for i in range(1, layers + 1):
            out[f"h{i}"] = torch.bmm(t[f"h{i - 1}"] if i == 1 else out[f"h{i - 1}"], t[f"w{i}"])
        for i in range(layers, 0, -1):
            x = t["h0"] if i == 1 else out[f"h{i - 1}"]
            out[f"dw{i}"] = torch.bmm(x.transpose(1, 2), t[f"dy{i}"])
            if i > 1:
                out[f"dx{i}"] = torch.bmm(t[f"dy{i}"], t[f"w{i}"].transpose(1, 2))

    one_step()
    torch.cuda.synchronize()
    reference = holder["h0"][0].astype(np.float64) @ holder["w1"][0]
    error = np.abs(out["h1"][0].cpu().numpy() - reference).max() / np.abs(reference).max()
    if not error < 1e-5:
        sys.exit(f"WRONG RESULT: cuBLAS fc1 max error {error:.3g}")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        one_step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        one_step()
    return timed(lambda n: [graph.replay() for _ in range(n)], torch.cuda.synchronize, args.steps, args.repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--widths", default="784,512,512,10")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cublas", action="store_true")
    parser.add_argument("--tf32-tiles", default="64x64x2x2x16",
                        help="tiles (BMxBNxWMxWNxBK, comma-separated; '' for none) of the tf32x3 engine to time")
    parser.add_argument("--tf32-stages", default="0",
                        help="for each tf32x3 tile, the cp.async ring depths to time (comma-separated; 0: operands "
                        "staged through registers, gemm_tf32; 2 or more: gemm_async, where both operands are wide)")
    parser.add_argument("--fma-tiles", default="", help="CUDA-core tiles (large, medium, small; comma-separated) "
                        "to force on every pass of the trial axis, one row each")
    args = parser.parse_args()
    args.fma_tiles = [name for name in args.fma_tiles.split(",") if name]
    widths = [int(w) for w in args.widths.split(",")]
    args.tf32_tiles = [tuple(int(v) for v in tile.split("x")) for tile in args.tf32_tiles.split(",") if tile]
    args.tf32_stages = [int(n) for n in args.tf32_stages.split(",") if n]
    rows = mlptrain_rows(args, widths, np.random.default_rng(args.seed))
    if not args.no_cublas:
        rows["cuBLAS (torch.bmm, no bias or activation)"] = cublas_row(args, widths)
    work = flops(widths, args.batch) * args.trials
    print(f"\n{args.trials} trials of {args.widths} at batch {args.batch}: the step's eight GEMMs, "
          f"{work / 1e9:.2f} GFLOP; median of {args.repeats} x {args.steps} graph replays")
    print(f"| variant | µs per step, all trials | TFLOP/s | x serial |\n| --- | --- | --- | --- |")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds * 1e6:.1f} | {work / seconds / 1e12:.1f} | {rows['serial'] / seconds:.2f} |")


if __name__ == "__main__":
    main()
