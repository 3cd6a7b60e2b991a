"""Every CUDA kernel of mlptrain, one module per family, each kernel with its
launcher right under it (the launcher checks shapes and dtypes and computes
the grid; nothing else launches a kernel).

Launchers take device arrays (C-contiguous; a row slice `buf[:n]` of a
preallocated buffer is fine) and write into the outputs they are given, with
the same names and signatures as their twins in `mlptrain.backends.numpy_kernels`.
No kernel uses atomics: every output element has one owning thread, so results
are bitwise reproducible run to run on the same GPU.
"""

from mlptrain.backends.numba_kernels import conv, data, gemm, loss, optim, pool, precision, reduce

__all__ = ["conv", "data", "gemm", "loss", "optim", "pool", "precision", "reduce"]
