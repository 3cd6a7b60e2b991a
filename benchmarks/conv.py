"""GPU time of each pass of each autoencoder convolution: mlptrain's kernels against cuDNN, one GPU, one run.

The layers of `configs/autoencoder_cifar10.yaml` at batch 256 (3x3, NHWC for mlptrain; cuDNN with TF32
off and autotuning on, timed in NCHW and in channels_last, the faster of the two reported as its figure),
passes forward (with ReLU), input gradient and weight gradient, in float32 or with
--precision bf16 / fp16 storage (cuDNN then runs in that format; our weight gradients stay float32).
Each launch queues behind a sleep kernel (see gemm.py's `gpu_ms`), median of --repeats after a
warm-up. Before anything is timed, each of our outputs is compared with cuDNN's (max |difference| /
max |cuDNN|): beyond TOLERANCE for its precision (a tile candidate's too) the script stops with exit
code 1, so a wrong kernel never gets a speed row. `--tiles`
also times each candidate tile forced on the implicit-GEMM passes (the tensor-core tiles of
MMA_CANDIDATES in 16-bit): the measurements behind conv.py's and conv_mma's tile choices. `--stagings` times each
version of STAGINGS for the precision: the register staging and the cp.async ring's tiles, depths and fragment
reads (ldmatrix or shared loads) in 16-bit, and for the 3-channel layers the passes padded or not (conv_padded),
the narrow tile's alternatives and a shallower ring; the CUDA-core tiles and tf32x3's stagings in float32.

    python benchmarks/conv.py [--repeats 9] [--precision fp32] [--tiles] [--stagings] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from gemm import gpu_ms  # noqa: E402

BATCH = 256
LAYERS = [(32, 3, 256), (16, 256, 128), (8, 128, 128), (16, 128, 256), (32, 256, 3)]  # (side, Cin, Cout)
OPS = ["forward", "backward_input", "backward_weight"]
CANDIDATES = [(128, 64, 8, 8, 4, 1), (128, 128, 8, 8, 8, 1), (64, 128, 8, 4, 8, 1), (128, 128, 16, 8, 8, 1)]
# max |ours - cuDNN| / max |cuDNN|: fp32 with TF32 off differs only in summation order (sums of up to 2,304
# products); 16-bit outputs are each rounded once to a format of 8 (bf16) or 11 (fp16) significant bits,
# on either side, so a few units of that rounding. A wrong kernel is off by order 1.
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 5e-3}
MMA_CANDIDATES = [(128, 128, 2, 4), (128, 128, 4, 2), (64, 128, 2, 4), (128, 64, 4, 2), (256, 128, 4, 2)]
# --stagings: each named version of the tensor-core passes, as (module, constant, value) patches. 16-bit: the
# register staging against the cp.async ring's pixel-row tiles and depths (the weight gradient keeps conv_mma.TILE,
# its chunks' plan, and takes the depth and `early`); float32: the CUDA-core tiles against tf32x3's two stagings.
STAGINGS = {
    "16-bit": [
        ("registers", [("conv_mma", "RING_STAGES", 0)]),
        ("ring, shared loads", [("conv_mma", "RING_LDMATRIX", False)]),
        ("ring 128x128x2x4 2 early", [("conv_mma", "RING_TILE", (128, 128, 2, 4))]),
        ("ring 2 late", [("conv_mma", "RING_EARLY", False)]),
        ("ring 128x64x4x2 3 early", [("conv_mma", "RING_TILE", (128, 64, 4, 2)), ("conv_mma", "RING_STAGES", 3)]),
    ],
    # the layers of 3 channels on one side: conv_padded's passes against conv_wide / conv_narrow / the register
    # staging, all four padded, the narrow tile's alternatives, a shallower ring
    "16-bit narrow": [
        ("not padded", [("conv_plan", "PADDED", frozenset())]),
        ("all padded", [("conv_plan", "PADDED", frozenset({("forward", "cin"), ("forward", "cout"),
                                                           ("backward_input", "cout"), ("backward_weight", "cin")}))]),
        ("narrow 32x16x2x1", [("conv_mma", "NARROW_RING_TILE", (32, 16, 2, 1))]),
        ("narrow ring 2", [("conv_mma", "NARROW_RING_STAGES", 2)]),
    ],
    "fp32": [
        ("cuda cores", [("conv_plan", "TF32X3", False)]),
        ("tf32x3 registers", [("conv_tf32", "STAGES", 0)]),
        ("tf32x3 ring 2 late", [("conv_tf32", "EARLY", False)]),
        ("tf32x3 ring 128x64 3 early", [("conv_tf32", "TILE", (128, 64, 4, 2, 16)), ("conv_tf32", "STAGES", 3)]),
    ],
}


def tensors(torch, side, cin, cout, dtype):
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return (torch.rand(*shape, device="cuda", generator=g) * 2 - 1).to(dtype)

    x = rand(BATCH, side, side, cin)
    return {"x": x, "w": rand(3, 3, cin, cout) * 0.1, "b": rand(cout), "dy": rand(BATCH, side, side, cout),
            "h": rand(BATCH, side, side, cin), "y": torch.empty(BATCH, side, side, cout, device="cuda", dtype=dtype),
            "dx": torch.empty(BATCH, side, side, cin, device="cuda", dtype=dtype),
            "dw": torch.empty(3, 3, cin, cout, device="cuda")}


def as_ours(cuda, torch, tensor):
    """A torch tensor as the numba device array our kernels take (bf16 as its bits in uint16)."""
    if tensor.dtype == torch.bfloat16:
        return cuda.as_cuda_array(tensor.view(torch.int16)).view(np.uint16)
    return cuda.as_cuda_array(tensor)


def our_launch(cuda, torch, conv, op, t):
    from mlptrain.activation import RELU

    a = {k: as_ours(cuda, torch, v) for k, v in t.items()}
    # with the scratch buffer the autoencoder gives the forward and the input gradient
    scratch = cuda.device_array(conv.conv2d_scratch(a["x"].shape, a["w"].shape, a["x"].dtype), a["w"].dtype)
    if op == "forward":
        return "y", lambda: conv.conv2d_forward(a["x"], a["w"], a["b"], a["y"], RELU, scratch)
    if op == "backward_input":
        return "dx", lambda: conv.conv2d_backward_input(a["dy"], a["w"], a["h"], a["dx"], RELU, scratch)
    space = cuda.device_array(max(1, conv.conv2d_backward_weight_workspace(a["x"].shape, a["dw"].shape, a["x"].dtype)), np.float32)
    return "dw", lambda: conv.conv2d_backward_weight(a["x"], a["dy"], a["dw"], 0.0, space)


LAYOUTS = ("nchw", "channels_last")  # cuDNN is timed in both; the faster is its figure (PyTorch's best)


def cudnn_launch(torch, op, t, layout="nchw"):
    """cuDNN's pass in `layout` and its result, laid out as ours."""
    F = torch.nn.functional
    memory = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x, dy, h = (t[k].permute(0, 3, 1, 2).contiguous(memory_format=memory) for k in ("x", "dy", "h"))
    w = t["w"].permute(3, 2, 0, 1).contiguous(memory_format=memory)
    if op == "forward":
        return lambda: F.relu(F.conv2d(x, w, t["b"], padding=1)), lambda r: r.permute(0, 2, 3, 1)
    if op == "backward_input":
        return (lambda: torch.nn.grad.conv2d_input(h.shape, w, dy, padding=1) * (h > 0),
                lambda r: r.permute(0, 2, 3, 1))
    return lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, padding=1), lambda r: r.permute(2, 3, 1, 0)


def relative_error(ours, expected) -> float:
    """max |ours - expected| / max |expected|; NaN (a NaN or an unwritten element) when either holds one."""
    return float((ours - expected).abs().max() / expected.abs().max())


def check(error: float, precision: str, what: str) -> None:
    """Exit 1, naming the pass, when `error` exceeds the precision's tolerance or is not a number."""
    if not error <= TOLERANCE[precision]:  # `not <=`: NaN fails too
        raise SystemExit(f"WRONG RESULT: {what}: max |ours - cuDNN| / max |cuDNN| = {error:.3g} exceeds the "
                         f"{precision} tolerance {TOLERANCE[precision]:g}; nothing was timed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--tiles", action="store_true")
    parser.add_argument("--stagings", action="store_true")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch
    from numba import cuda

    from mlptrain.backends.numba_kernels import conv, conv_mma, conv_plan, conv_tf32

    modules = {"conv_mma": conv_mma, "conv_plan": conv_plan, "conv_tf32": conv_tf32}

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    mma = args.precision != "fp32"

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True

    @cuda.jit
    def sleep(rounds):
        for _ in range(rounds):
            cuda.nanosleep(100000)

    rows = []
    for side, cin, cout in LAYERS:
        for op in OPS:
            t = tensors(torch, side, cin, cout, dtype)
            flops = 2.0 * BATCH * side * side * 9 * cin * cout
            expected, theirs, layout = None, float("inf"), None
            for candidate in LAYOUTS:
                run, finish = cudnn_launch(torch, op, t, candidate)
                result = finish(run()).contiguous().float()
                if expected is None:
                    expected = result
                else:  # both layouts must agree before either is timed
                    check(relative_error(result, expected), args.precision, f"{side}x{side} {cin}->{cout} {op} "
                          f"cuDNN {candidate} against cuDNN nchw")
                ms = gpu_ms(cuda, sleep, run, args.repeats, 5)
                if ms < theirs:
                    theirs, layout = ms, candidate
            candidates = MMA_CANDIDATES if mma else CANDIDATES
            versions = [("ours", None)] + ([(c, c) for c in candidates] if args.tiles and min(cin, cout) > 8 else [])
            narrow = min(cin, cout) <= 8
            if args.stagings and (mma or not narrow):
                versions += STAGINGS[("16-bit narrow" if narrow else "16-bit") if mma else "fp32"]
            for name, tile in versions:
                if isinstance(tile, list):  # a staging's patches
                    original = [(module, constant, getattr(modules[module], constant)) for module, constant, _ in tile]
                    for module, constant, value in tile:
                        setattr(modules[module], constant, value)
                elif tile is not None:
                    if mma:
                        original, conv_mma.TILE = conv_mma.TILE, tile
                    else:
                        conv_plan.TILES["forced"] = (tile, 0)
                        original, conv_plan.pick_tile = conv_plan.pick_tile, lambda rows, columns, weight=False: "forced"
                try:
                    out, launch = our_launch(cuda, torch, conv, op, t)
                    t[out].fill_(float("nan"))  # a pass that skips part of its output cannot pass the check
                    launch()
                    torch.cuda.synchronize()
                    error = relative_error(t[out].float(), expected)
                    check(error, args.precision, f"{side}x{side} {cin}->{cout} {op} {name if tile is None else tile}")
                    ms = gpu_ms(cuda, sleep, launch, args.repeats, 5)
                except Exception as error:  # a candidate tile that does not build: say so, time the rest
                    if tile is None:
                        raise
                    print(f"{side}x{side} {cin}->{cout} {op} tile {tile}: {str(error).splitlines()[0]}")
                    continue
                finally:
                    if isinstance(tile, list):
                        for module, constant, value in original:
                            setattr(modules[module], constant, value)
                    elif tile is not None and mma:
                        conv_mma.TILE = original
                    elif tile is not None:
                        conv_plan.pick_tile = original
                        del conv_plan.TILES["forced"]
                rows.append({"layer": f"{side}x{side} {cin}->{cout}", "op": op,
                             "version": name if tile is None or isinstance(tile, list) else "x".join(map(str, tile)),
                             "ms": ms, "cudnn_ms": theirs, "tflops": flops / ms / 1e9,
                             "cudnn_tflops": flops / theirs / 1e9, "cudnn_layout": layout, "rel_error": error})
    print("\n| layer | pass | version | ms | cuDNN ms (layout) | TFLOP/s | cuDNN TFLOP/s | ratio | rel. error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['layer']} | {r['op']} | {r['version']} | {r['ms']:.3f} | "
              f"{r['cudnn_ms']:.3f} ({r['cudnn_layout']}) | {r['tflops']:.1f} | {r['cudnn_tflops']:.1f} | "
              f"{r['cudnn_ms'] / r['ms']:.2f} | {r['rel_error']:.1e} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
