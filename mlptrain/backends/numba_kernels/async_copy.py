"""Copies from global to shared memory that run while the copying threads go on (cp.async; CUDA backend, sm_80+).

A tile product that stages its operands through registers waits for each slice's loads before it can store them:
with one slice in flight, the loads' latency (~0.5-1 µs) outlasts a 16-deep slice's products. cp.async writes
shared memory itself, so several slices can be in flight at no register cost:

    address = shared_address(shared, e)     where shared[e] lies in the block's shared memory, in bytes (uint32)
    copy16_to(address, shared, array, offset, valid)
                                            the 16 bytes at `address` (shared_address's, plus any multiple of
                                            16 bytes inside `shared`) = the 16 bytes `offset` bytes into an
                                            array, its last axis contiguous (four float32, array[i, j:j + 4] at
                                            offset i * strides[0] + j * 4 of a matrix, or eight 16-bit elements
                                            into the 4-byte words of a uint32 `shared`), or zeros where `valid`
                                            is False (nothing is read then)
    commit()                                closes the group of this thread's copies issued since the last commit
    wait_all_but(n)()                       waits until at most n of this thread's groups are still in flight
                                            (then a barrier makes every thread's copies visible to the block)

The copies need both addresses 16-byte aligned (numba_kernels.wide.aligned_rows checks the global operand; the
shared offsets are multiples of four floats of an aligned array). On the CUDA simulator a copy is made at once,
and commit and wait do nothing.
"""

import functools

import numpy as np

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, cuda
from mlptrain.backends.numba_kernels.wide import element_pointer


def _simulated():
    @cuda.jit(device=True)
    def shared_address(shared, e):
        return e * 4  # bytes from the array's start: copy16_to takes them back to its elements

    @cuda.jit(device=True)
    def copy16_to(address, shared, array, offset, valid):
        e = address // 4
        for n in range(4):
            shared[e + n] = 0
        if valid:
            index = []  # the element `offset` bytes in, along every axis (rows of a matrix, pixels of an image)
            for stride in array.strides:
                index.append(offset // stride)
                offset -= index[-1] * stride
            j = index.pop()

            def at(j):
                return array[(*index, j)]

            if array.strides[-1] == 4:
                for n in range(4):
                    shared[e + n] = at(j + n)
            else:  # eight 16-bit elements, two a word, the first in its low half (the GPU's little-endian bytes)
                for n in range(4):
                    low, high = (int(np.array(at(j + 2 * n + h)).view(np.uint16)) for h in range(2))
                    shared[e + n] = low | (high << 16)

    @cuda.jit(device=True)
    def commit():
        pass

    def waiting(n):
        @cuda.jit(device=True)
        def wait():
            pass

        return wait

    return copy16_to, shared_address, commit, waiting


def _inline():
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    @intrinsic
    def shared_address(typingctx, shared, e):
        signature = types.uint32(shared, e)

        def codegen(context, builder, sig, args):
            pointer = builder.ptrtoint(element_pointer(context, builder, sig.args[0], args[0], [args[1]],
                                                       [sig.args[1]]), i64)
            # numba hands shared arrays over as generic pointers: cp.async takes a shared-window address, which
            # fits 32 bits, so that a slice's addresses are 32-bit sums
            asm = ir.InlineAsm(ir.FunctionType(i32, [i64]),
                               "{ .reg .u64 s; cvta.to.shared.u64 s, $1; cvt.u32.u64 $0, s; }", "=r,l")
            return builder.call(asm, [pointer])

        return signature, codegen

    @intrinsic
    def copy16_to(typingctx, address, shared, array, offset, valid):
        signature = types.void(address, shared, array, offset, valid)

        def codegen(context, builder, sig, args):
            destination = context.cast(builder, args[0], sig.args[0], types.uint32)
            data = context.make_array(sig.args[2])(context, builder, args[2]).data
            source = builder.add(builder.ptrtoint(data, i64), context.cast(builder, args[3], sig.args[3], types.int64))
            bytes_read = builder.select(context.cast(builder, args[4], sig.args[4], types.boolean),
                                        ir.Constant(i32, 16), ir.Constant(i32, 0))
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32, i64, i32]),
                               "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [destination, source, bytes_read])
            return context.get_dummy_value()

        return signature, codegen

    def statement(text):
        @intrinsic
        def emit(typingctx):
            def codegen(context, builder, sig, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()

            return types.void(), codegen

        return emit

    commit = statement("cp.async.commit_group;")

    @functools.cache
    def waiting(n):
        return statement(f"cp.async.wait_group {int(n)};")

    return copy16_to, shared_address, commit, waiting


@functools.cache
def _parts():
    return _simulated() if config.ENABLE_CUDASIM else _inline()


def _part(which, *args):
    made = _parts()[which]
    return made(*args) if args else made


def _deferred(which, *args):
    return Deferred(_part, (which, *args)) if DEFERRED else _part(which, *args)


copy16_to = _deferred(0)
shared_address = _deferred(1)
commit = _deferred(2)


def wait_all_but(n: int):
    """The device function that waits until at most `n` of the calling thread's committed groups are in flight."""
    return _deferred(3, n)
