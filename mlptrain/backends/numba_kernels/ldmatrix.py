"""Four 8 x 8 matrices of 16-bit values from shared memory into a warp's mma fragment registers, one instruction
(ldmatrix.sync.aligned.m8n8.x4; CUDA backend, sm_75+).

    r0, r1, r2, r3 = load(shared, address)     with load = ldmatrix4(trans)

Every lane of the warp calls it together, each with the shared-memory `address` (async_copy.shared_address's, in
bytes) of one matrix row of 8 contiguous 16-bit values, 16-byte aligned: lanes 8q..8q+7 give rows 0-7 of matrix q.
Register q of lane (g = lane // 4, t = lane % 4) receives two values of matrix q, the lower in its low half: row g,
columns 2t and 2t + 1; with `trans`, column g, rows 2t and 2t + 1. That is one mma fragment register (gemm_mma), read
from a slice kept [row, k] (k-contiguous, no trans) or [k, row] (row-contiguous, trans): one instruction where the
shared loads of one register each took four, and a row-contiguous one's pairing of half-words more.

`shared` is the uint32 array the address lies in: the GPU reads the address alone; the CUDA simulator trades the
lanes' addresses through shared memory (every thread of the block must call it together there, as with
tensor_core.mma) and reads the words of `shared` they name.
"""

import functools

import numpy as np

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, cuda


def _simulated(trans):
    MAX_WARPS = 32

    @cuda.jit(device=True)
    def load(shared, address):
        rows = cuda.shared.array((MAX_WARPS, 32), np.uint32)
        warp, me = cuda.threadIdx.x // 32, cuda.threadIdx.x % 32
        rows[warp, me] = address
        cuda.syncthreads()
        g, t = me // 4, me % 4
        out = []
        for q in range(4):
            def half(row, column):  # element (row, column) of matrix q: half `column` of the row's 16 bytes
                word = int(shared[rows[warp, 8 * q + row] // 4 + column // 2])
                return (word >> (16 * (column % 2))) & 0xFFFF

            low, high = (half(2 * t, g), half(2 * t + 1, g)) if trans else (half(g, 2 * t), half(g, 2 * t + 1))
            out.append(np.uint32(low | (high << 16)))
        cuda.syncthreads()
        return out[0], out[1], out[2], out[3]

    return load


def _inline(trans):
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    instruction = ("ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "")
                   + ".shared.b16 {$0, $1, $2, $3}, [$4];")

    @intrinsic
    def load(typingctx, shared, address):
        signature = types.UniTuple(types.uint32, 4)(shared, address)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            # a side effect: the loads must stay after the barrier that made the slice whole, and one per call
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32]), instruction,
                               "=r,=r,=r,=r,r,~{memory}", side_effect=True)
            out = builder.call(asm, [context.cast(builder, args[1], sig.args[1], types.uint32)])
            return context.make_tuple(builder, sig.return_type, [builder.extract_value(out, i) for i in range(4)])

        return signature, codegen

    return load


@functools.cache
def _made(trans):
    return _simulated(trans) if config.ENABLE_CUDASIM else _inline(trans)


def ldmatrix4(trans: bool):
    """The warp's load of four 8 x 8 16-bit matrices (transposed where `trans`) into fragment registers."""
    return Deferred(_made, (bool(trans),)) if DEFERRED else _made(bool(trans))
