"""Sixteen-byte loads and stores of four float32 (CUDA backend), for staging tiles four elements an instruction.

Numba emits one 4-byte access per element it reads, and with it the element's address arithmetic: a tile's
staging then issued more instructions than its tensor-core products (benchmarks/NOTES.md, issue 30 step 5).

    v0, v1, v2, v3 = load4(array, i, j)      array[i, j:j + 4] of a 2-D float32 array, one ld.global.v4
    v0, v1, v2, v3 = load4_flat(array, e)    array[e:e + 4] of a 1-D float32 array, the same
    store4(array, e, v0, v1, v2, v3)         array[e:e + 4] = v0..v3 of a 1-D float32 array, shared or global
                                             memory (a generic-address st.v4)
    v0, v1, v2, v3 = load_quad(array, e, quads)  array[e:e + 4]: load4_flat with `quads`, else four accesses
    store_quad(array, e, v0, v1, v2, v3, quads)   store4 with `quads`, else four accesses

All need the four elements' first byte 16-byte aligned (`aligned_rows` and `aligned_quads` check an operand on the
host) and the four inside the array: nothing is checked on the device. On the CUDA simulator they are four element
accesses.
"""

import functools

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, cuda

ALIGN = 16  # bytes of one access


def aligned_rows(array) -> bool:
    """Whether every row of a float32 `array` (2-D, or 3-D with a leading trial axis) starts 16-byte aligned and
    splits into whole groups of four: a float32 array's `copyable_rows`."""
    return str(array.dtype) == "float32" and copyable_rows(array)


def copyable_rows(array) -> bool:
    """Whether cp.async can copy every row of `array` (2-D, or 3-D with a leading trial axis; any storage format) in
    whole 16-byte pieces (gemm_async): its last axis contiguous and a multiple of 16 bytes long, every other stride
    a multiple of 16 bytes and its first element 16-byte aligned."""
    if len(array.shape) not in (2, 3):
        return False
    size, strides = array.dtype.itemsize, tuple(array.strides)
    if strides[-1] != size or (tuple(array.shape)[-1] * size) % ALIGN or any(s % ALIGN for s in strides[:-1]):
        return False
    return address(array) % ALIGN == 0


def aligned_quads(array) -> bool:
    """Whether a float32 `array`'s every row (its last axis; a 1-D array is one row) starts 16-byte aligned: its
    elements contiguous along the last axis, every other stride a multiple of 16 bytes and its first element
    16-byte aligned, so element 4q of a row starts a quad load4 can read."""
    if str(array.dtype) != "float32" or not array.shape:
        return False
    strides = tuple(array.strides)
    if strides[-1] != 4 or any(s % ALIGN for s in strides[:-1]):
        return False
    return address(array) % ALIGN == 0


def address(array) -> int:
    """The address of an array's first element: a device array's (numba's or the driver path's), the wrapped
    NumPy array's on the simulator."""
    pointer = getattr(array, "pointer", None)  # the driver path's arrays: no interface dict made at every launch
    if isinstance(pointer, int):
        return pointer
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        return int(interface["data"][0] or 0)
    return int(array._ary.ctypes.data)  # numba's simulator array: a NumPy array inside


def _simulated():
    @cuda.jit(device=True)
    def load4(array, i, j):
        return array[i, j], array[i, j + 1], array[i, j + 2], array[i, j + 3]

    @cuda.jit(device=True)
    def load4_flat(array, e):
        return array[e], array[e + 1], array[e + 2], array[e + 3]

    @cuda.jit(device=True)
    def store4(array, e, v0, v1, v2, v3):
        array[e], array[e + 1], array[e + 2], array[e + 3] = v0, v1, v2, v3

    return load4, store4, load4_flat


def element_pointer(context, builder, array_type, array, indices, index_types):
    """In an intrinsic's code generation: the LLVM pointer to `array`[indices] (an intrinsic's array argument and
    its index arguments, with their numba types), as numba's own indexing computes it."""
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from numba import types
    from numba.core import cgutils

    indices = [context.cast(builder, v, t, types.intp) for v, t in zip(indices, index_types)]
    data = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, data, indices, wraparound=False)


def _inline():
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def load_codegen(context, builder, sig, args):
        f32 = ir.FloatType()
        pointer = element_pointer(context, builder, sig.args[0], args[0], args[1:], sig.args[1:])
        where = builder.ptrtoint(pointer, ir.IntType(64))
        function = ir.FunctionType(ir.LiteralStructType([f32] * 4), [ir.IntType(64)])
        asm = ir.InlineAsm(function, "ld.global.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l")
        values = builder.call(asm, [where])
        return context.make_tuple(builder, sig.return_type, [builder.extract_value(values, n) for n in range(4)])

    @intrinsic
    def load4(typingctx, array, i, j):
        return types.UniTuple(types.float32, 4)(array, i, j), load_codegen

    @intrinsic
    def load4_flat(typingctx, array, e):
        return types.UniTuple(types.float32, 4)(array, e), load_codegen

    @intrinsic
    def store4(typingctx, shared, e, v0, v1, v2, v3):
        signature = types.void(shared, e, v0, v1, v2, v3)

        def codegen(context, builder, sig, args):
            vector_type = ir.VectorType(ir.FloatType(), 4)
            pointer = element_pointer(context, builder, sig.args[0], args[0], [args[1]], [sig.args[1]])
            vector = ir.Constant(vector_type, ir.Undefined)
            for n, value in enumerate(args[2:]):
                vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), n))
            # a generic-address store: numba's shared arrays hand their data over as generic pointers
            builder.store(vector, builder.bitcast(pointer, vector_type.as_pointer()), align=ALIGN)
            return context.get_dummy_value()

        return signature, codegen

    return load4, store4, load4_flat


@functools.cache
def _pair():
    return _simulated() if config.ENABLE_CUDASIM else _inline()


def _made(which):
    return _pair()[which]


def accessor(which: int):
    """load4 (0), store4 (1) or load4_flat (2) for the device code that closes over it; an intrinsic needs numba,
    so on the deferred path it is made when that code compiles."""
    return Deferred(_made, (which,)) if DEFERRED else _made(which)


load4 = accessor(0)
store4 = accessor(1)
load4_flat = accessor(2)


@kernel_cache.device
def load_quad(array, e, quads):
    """array[e:e + 4] of a 1-D float32 array: one 16-byte access (load4_flat) with `quads` (the array aligned:
    `aligned_quads`), else four; the same values either way."""
    if quads:
        return load4_flat(array, e)
    return array[e], array[e + 1], array[e + 2], array[e + 3]


@kernel_cache.device
def store_quad(array, e, v0, v1, v2, v3, quads):
    """array[e:e + 4] = v0..v3 of a 1-D float32 array: one 16-byte access (store4) with `quads`, else four."""
    if quads:
        store4(array, e, v0, v1, v2, v3)
    else:
        array[e], array[e + 1], array[e + 2], array[e + 3] = v0, v1, v2, v3
