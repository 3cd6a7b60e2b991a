"""A kernel's first statement, which lets the GPU start it before the kernel ahead of it in the stream ends.

A step is a chain of small kernels, each reading what the last wrote. Between two of them the GPU drains the
first grid, then launches the second and fills its blocks: ~1 µs a boundary in a replayed CUDA graph, a dozen or
more a step. With programmatic dependent launch (sm_90+: a launch attribute, see backends.driver.launch) the next
grid is launched as this one's blocks exit, while its last writes are still being flushed, and its blocks wait
until this grid has ended and its writes are visible. So every kernel opens with

    after_previous_grid()   waits until the grid launched before it in the stream has finished, its writes
                            visible (`griddepcontrol.wait`; at once where the kernel was launched without the
                            attribute)

before it reads or writes any global memory: the kernel then sees and overwrites exactly what it would in plain
stream order (a write-after-read on a buffer its predecessor reads is as safe as the reads), so its results and
bits are the same with the attribute or without it. A test holds every kernel of the package to that first
statement. Compiled for a GPU before sm_90, and on the simulator, it does nothing (the launch then has no
attribute either).

No kernel releases its successor earlier (`griddepcontrol.launch_dependents` at its start): the successor's blocks
then sat resident beside it, placed wherever it had room, and an MLP step at batch 128 took 97.6 µs instead of
79.0 (releasing at each block's exit, as here: 74.5-75.0; H200, benchmarks/NOTES.md, issue 31 step 3).
"""

import functools

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, cuda


def _simulated():
    @cuda.jit(device=True)
    def after_previous_grid():
        pass

    return after_previous_grid


def _inline():
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from llvmlite import ir
    from numba import cuda as numba_cuda
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def after_previous_grid(typingctx):
        def codegen(context, builder, sig, args):
            # numba compiles a kernel for the current GPU: griddepcontrol needs sm_90 (PTX ISA 7.8)
            if numba_cuda.get_current_device().compute_capability >= (9, 0):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "griddepcontrol.wait;", "~{memory}",
                                          side_effect=True), [])
            return context.get_dummy_value()

        return types.void(), codegen

    return after_previous_grid


@functools.cache
def _made():
    return _simulated() if config.ENABLE_CUDASIM else _inline()


after_previous_grid = Deferred(_made) if DEFERRED else _made()
