"""Copies from global to shared memory that run while the copying threads go on (cp.async; CUDA backend, sm_80+).

A tile product that stages its operands through registers waits for each slice's loads before it can store them:
with one slice in flight, the loads' latency (~0.5-1 µs) outlasts a 16-deep slice's products. cp.async writes
shared memory itself, so several slices can be in flight at no register cost:

    copy16_at(shared, e, array, offset, valid)
                                            shared[e:e + 4] = the four float32 `offset` bytes into a 2-D float32
                                            array (its rows contiguous: array[i, j:j + 4] at offset i * strides[0]
                                            + j * 4), or four zeros where `valid` is False (nothing is read then)
    commit()                                closes the group of this thread's copies issued since the last commit
    wait_all_but(n)()                       waits until at most n of this thread's groups are still in flight
                                            (then a barrier makes every thread's copies visible to the block)

The copies need both addresses 16-byte aligned (numba_kernels.wide.aligned_rows checks the global operand; the
shared offsets are multiples of four floats of an aligned array). On the CUDA simulator a copy is made at once,
and commit and wait do nothing.
"""

import functools

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, cuda
from mlptrain.backends.numba_kernels.wide import element_pointer


def _simulated():
    @cuda.jit(device=True)
    def copy16_at(shared, e, array, offset, valid):
        for n in range(4):
            shared[e + n] = 0.0
        if valid:
            i = offset // array.strides[0]
            j = (offset - i * array.strides[0]) // array.strides[1]
            for n in range(4):
                shared[e + n] = array[i, j + n]

    @cuda.jit(device=True)
    def commit():
        pass

    def waiting(n):
        @cuda.jit(device=True)
        def wait():
            pass

        return wait

    return copy16_at, commit, waiting


def _inline():
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    @intrinsic
    def copy16_at(typingctx, shared, e, array, offset, valid):
        signature = types.void(shared, e, array, offset, valid)

        def codegen(context, builder, sig, args):
            destination = builder.ptrtoint(
                element_pointer(context, builder, sig.args[0], args[0], [args[1]], [sig.args[1]]), i64)
            data = context.make_array(sig.args[2])(context, builder, args[2]).data
            source = builder.add(builder.ptrtoint(data, i64), context.cast(builder, args[3], sig.args[3], types.int64))
            bytes_read = builder.select(context.cast(builder, args[4], sig.args[4], types.boolean),
                                        ir.Constant(i32, 16), ir.Constant(i32, 0))
            # numba hands shared arrays over as generic pointers: cp.async takes a shared-window address
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i64, i64, i32]),
                               "{ .reg .u64 s; cvta.to.shared.u64 s, $0; cp.async.cg.shared.global [s], [$1], 16, $2; }",
                               "l,l,r,~{memory}", side_effect=True)
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

    return copy16_at, commit, waiting


@functools.cache
def _parts():
    return _simulated() if config.ENABLE_CUDASIM else _inline()


def _part(which, *args):
    made = _parts()[which]
    return made(*args) if args else made


def _deferred(which, *args):
    return Deferred(_part, (which, *args)) if DEFERRED else _part(which, *args)


copy16_at = _deferred(0)
commit = _deferred(1)


def wait_all_but(n: int):
    """The device function that waits until at most `n` of the calling thread's committed groups are in flight."""
    return _deferred(2, n)
