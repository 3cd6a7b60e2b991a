"""A kernel's first statement, which lets the GPU start it before the kernel ahead of it in the stream ends.

A step is a chain of small kernels, each reading what the last wrote. Between two of them the GPU drains the
first grid, then launches the second and fills its blocks: ~1 µs a boundary in a replayed CUDA graph, a dozen or
more a step. With programmatic dependent launch (sm_90+: a launch attribute, see backends.driver.launch) the next
grid may be launched while this one runs, and its blocks wait, resident, until this grid has ended and its
writes are visible. So every kernel opens with

    after_previous_grid()   waits until the grid launched before it in the stream has finished, its writes
                            visible (`griddepcontrol.wait`: at once where the kernel was launched without the
                            attribute), then lets the next grid's blocks be launched (`griddepcontrol.
                            launch_dependents`, once every block of this grid has run it or exited)

before it reads or writes any global memory: the kernel then sees and overwrites exactly what it would in plain
stream order (a write-after-read on a buffer its predecessor reads is as safe as the reads), so its results and
bits are the same with the attribute or without it. A test holds every kernel of the package to that first
statement. Compiled for a GPU before sm_90, and on the simulator, it does nothing (the launch then has no
attribute either).
"""

import functools

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, cuda

# Where the next grid's launch is released: at this grid's start (its blocks then wait resident while this one
# runs) or, where False, at its end (each block's exit: the next grid's launch still overlaps the drain).
RELEASE_AT_START = True


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
                text = "griddepcontrol.wait;" + (" griddepcontrol.launch_dependents;" if RELEASE_AT_START else "")
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True), [])
            return context.get_dummy_value()

        return types.void(), codegen

    return after_previous_grid


@functools.cache
def _made():
    return _simulated() if config.ENABLE_CUDASIM else _inline()


after_previous_grid = Deferred(_made) if DEFERRED else _made()
