"""A block's threads' sums added into one, in a fixed order (CUDA backend): the last step of the reductions
whose partials a step's rules read (`reduce.sum_of_squares`, and `optim.adam_update` summing as it updates);
and a block's sum written where a gradient is overwritten or accumulated (the bias gradients': reduce.py,
gemm_weight.py)."""

import functools

from mlptrain.backends.kernel_cache import kernels as kernel_cache
from mlptrain.backends.kernel_cache.numba_names import cuda, float32


@functools.cache
def make_block_sum(threads):
    """The device function block_sum(total) -> float32: the sum of every thread's `total` over a block of
    `threads` threads (a power of two), by a shared-memory tree of a fixed pairing (width threads / 2 down to 1,
    partial t + width added into partial t): thread 0's return value. Every thread of the block calls it
    together."""

    @kernel_cache.device
    def block_sum(total):
        cache = cuda.shared.array(threads, float32)
        t = cuda.threadIdx.x
        cache[t] = total
        cuda.syncthreads()
        width = threads // 2
        while width > 0:
            if t < width:
                cache[t] += cache[t + width]
            cuda.syncthreads()
            width //= 2
        return cache[0]

    return block_sum


@kernel_cache.device
def accumulate(out, row, n, total, beta):
    """out[row, n] = beta * out[row, n] + total; beta 0 never reads out (it may hold garbage)."""
    if beta == float32(0):
        out[row, n] = total
    else:
        out[row, n] = beta * out[row, n] + total
