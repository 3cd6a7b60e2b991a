"""Storage formats on the device: `codec(dtype)` returns the device functions (load, store) a kernel factory
closes over. load turns a stored element into float32, store rounds a float32 to the storage format (round
to nearest, ties to even). A kernel built for float32 storage gets identity functions, so fp32 pays nothing
for the choice. bf16 lives in uint16 (see `mlptrain.dtypes`). Every kernel family that stores activations
or weights in a low format builds on these; precision.py's cast kernels among them.
"""

import numpy as np

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, float32, int32, types, uint16, uint32

if config.ENABLE_CUDASIM:  # libdevice's bit casts are stubs on the simulator: the same casts in NumPy
    def float_bits(v):
        return np.array(v, np.float32).view(np.uint32)[()]

    def bits_float(u):
        return np.array(int(u) & 0xFFFFFFFF, np.uint32).view(np.float32)[()]

    def half_bits(v):
        return np.uint32(np.array(v, np.float16).view(np.uint16)[()])

    def bits_half(u):
        return np.array(int(u) & 0xFFFF, np.uint16).view(np.float16)[()]
else:
    from mlptrain.backends.kernel_cache.numba_names import libdevice

    @kernel_cache.device
    def float_bits(v):
        return uint32(libdevice.float_as_int(v))

    @kernel_cache.device
    def bits_float(u):
        return libdevice.int_as_float(int32(u))

    def _make_half_bits():
        # imported on first use: numba takes seconds to import, and the CPU path never needs it
        from llvmlite import ir
        from numba import types as numba_types
        from numba.cuda.extending import intrinsic

        @intrinsic
        def half_bits(typingctx, v):
            def codegen(context, builder, sig, args):
                return builder.zext(builder.bitcast(args[0], ir.IntType(16)), ir.IntType(32))

            return numba_types.uint32(numba_types.float16), codegen

        return half_bits

    half_bits = Deferred(_make_half_bits, ()) if DEFERRED else _make_half_bits()  # an fp16 value's bits, as uint32

    def _make_bits_half():
        # imported on first use, as half_bits'
        from llvmlite import ir
        from numba import types as numba_types
        from numba.cuda.extending import intrinsic

        @intrinsic
        def bits_half(typingctx, u):
            def codegen(context, builder, sig, args):
                return builder.trunc(args[0], ir.IntType(16))  # numba-cuda keeps an fp16 value as its 16 bits

            return numba_types.float16(numba_types.uint32), codegen

        return bits_half

    bits_half = Deferred(_make_bits_half, ()) if DEFERRED else _make_bits_half()  # uint32's low 16 bits as an fp16


@kernel_cache.device
def _identity(v):
    return v


@kernel_cache.device
def _load_fp16(x):
    return float32(x)


@kernel_cache.device
def _store_fp16(v):
    return types.float16(v)


@kernel_cache.device
def _load_bf16(x):
    return bits_float(uint32(x) << 16)


@kernel_cache.device
def _store_bf16(v):
    u = float_bits(v)
    if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep it a quiet NaN rather than round it to inf
        return uint16((u >> 16) | 0x40)
    return uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


_CODECS = {
    np.dtype(np.float32): (_identity, _identity),
    np.dtype(np.float16): (_load_fp16, _store_fp16),
    np.dtype(np.uint16): (_load_bf16, _store_bf16),
}
STORAGE_DTYPES = tuple(str(d) for d in _CODECS)


def codec(dtype):
    """(load, store) device functions for a storage dtype."""
    return _CODECS[np.dtype(dtype)]
