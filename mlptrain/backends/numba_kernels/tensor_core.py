"""One warp-wide tensor-core product, mma.sync m16n8k16 (16-bit inputs) or m16n8k8 (tf32 inputs) with float32
accumulators (CUDA backend).

Numba emits no mma instruction, so `mma(kind)` returns a device function that
inlines it as PTX assembly into the kernel's LLVM IR: no nvcc, no NVRTC and no
linked file, and the fragments stay in registers (a call into linked PTX would
pass them through local memory). `kind` is "bf16" or "fp16", the format of the
16-bit inputs, passed as their raw bits two to a uint32.

    d = mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)   D (16 x 8) = A (16 x 16) @ B (16 x 8) + C

The 32 lanes of a warp hold the fragments (PTX ISA, "mma.m16n8k16"): with
g = lane // 4 and t = lane % 4, a0 holds A[g, 2t:2t+2], a1 A[g+8, 2t:2t+2],
a2 A[g, 2t+8:2t+10], a3 A[g+8, 2t+8:2t+10]; b0 holds B[2t:2t+2, g], b1
B[2t+8:2t+10, g] (the lower k in the low half-word); c0, c1 are C[g, 2t:2t+2]
and c2, c3 C[g+8, 2t:2t+2], and d likewise. Every lane of the warp must call
it together.

`kind` "tf32" is m16n8k8 on float32 bits, one value a register, of which the tensor core reads the top 19
bits (sign, exponent, 10 mantissa bits): D (16 x 8) = A (16 x 8) @ B (8 x 8) + C, a0 holds A[g, t], a1
A[g+8, t], a2 A[g, t+4], a3 A[g+8, t+4]; b0 holds B[t, g], b1 B[t+4, g]; C and D as above.

On the CUDA simulator the same function trades the fragments through shared
memory and sums each product in float64 before rounding to float32 (the GPU
sums a product's 16 terms with its own internal rounding, so results agree to
float32 rounding, not bit for bit). There every thread of the block must call
it together: it synchronises the block.
"""

import numpy as np

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, cuda

KINDS = ("bf16", "fp16", "tf32")
CAPABILITY = (8, 0)  # the first compute capability with these mma shapes (and cp.async, which their tiles use)
_SHAPE = {"bf16": "m16n8k16.row.col.f32.bf16.bf16.f32", "fp16": "m16n8k16.row.col.f32.f16.f16.f32",
          "tf32": "m16n8k8.row.col.f32.tf32.tf32.f32"}
TF32_MASK = 0xFFFFE000  # the bits of a float32 the tensor core reads as tf32


def _decode(bits, kind):
    """float64 values of the two 16-bit numbers in each uint32 of `bits` (low half first); for tf32, of
    the one tf32 number in each (its low 13 bits dropped), as a trailing axis of one."""
    bits = np.asarray(bits, np.uint32)
    if kind == "tf32":
        return (bits & np.uint32(TF32_MASK)).view(np.float32).astype(np.float64)[..., None]
    halves = np.stack([bits & 0xFFFF, bits >> 16], axis=-1).astype(np.uint16)
    if kind == "bf16":
        return (halves.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return halves.view(np.float16).astype(np.float64)


def _simulated(kind):
    MAX_WARPS = 32  # 1,024 threads a block
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    pair = 2 * t[:, None] + np.arange(2)  # the two k (A) or columns (C) of a register, per lane
    rows = g[:, None]
    STEP = 8 if kind == "tf32" else 16  # k of one product
    HALF = STEP // 2
    ks = t[:, None] if kind == "tf32" else pair  # the k of a register's value(s), per lane

    @cuda.jit(device=True)
    def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        lanes = cuda.shared.array((MAX_WARPS, 32, 6), np.uint32)
        warp, me = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
        lanes[warp, me, :] = (a0, a1, a2, a3, b0, b1)
        cuda.syncthreads()
        values = _decode(lanes[warp], kind)  # (lane, register, half)
        cuda.syncthreads()
        a, b = np.zeros((16, STEP)), np.zeros((STEP, 8))
        a[rows, ks], a[rows + 8, ks] = values[:, 0], values[:, 1]
        a[rows, ks + HALF], a[rows + 8, ks + HALF] = values[:, 2], values[:, 3]
        b[ks, rows], b[ks + HALF, rows] = values[:, 4], values[:, 5]
        d = a[[g[me], g[me] + 8]] @ b[:, pair[me]]
        return (np.float32(d[0, 0] + c0), np.float32(d[0, 1] + c1),
                np.float32(d[1, 0] + c2), np.float32(d[1, 1] + c3))

    return mma


def _inline(kind):
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    instruction = ("mma.sync.aligned." + _SHAPE[kind]
                   + " {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")

    @intrinsic
    def mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        signature = types.UniTuple(types.float32, 4)(*([types.uint32] * 6), *([types.float32] * 4))

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            function = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            asm = ir.InlineAsm(function, instruction, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            d = builder.call(asm, args)
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(d, i) for i in range(4)])

        return signature, codegen

    return mma


def mma(kind):
    """The tensor-core product for inputs of `kind`: m16n8k16 for "bf16" or "fp16", m16n8k8 for "tf32"."""
    if kind not in KINDS:
        raise ValueError(f"no tensor-core product for {kind!r} (expected one of {KINDS})")
    if config.ENABLE_CUDASIM:
        return _simulated(kind)
    return Deferred(_inline, (kind,)) if DEFERRED else _inline(kind)  # an intrinsic needs numba: made when it compiles
