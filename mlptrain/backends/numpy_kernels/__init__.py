"""NumPy twins of `mlptrain.backends.numba_kernels`: same modules, names and signatures.

Every function writes into the output arrays it is given (no return value), so
the static graph in `mlptrain.nn` drives both backends with one code path.
"""

from mlptrain.backends.numpy_kernels import conv, data, gemm, loss, optim, pool, precision, reduce

__all__ = ["conv", "data", "gemm", "loss", "optim", "pool", "precision", "reduce"]
