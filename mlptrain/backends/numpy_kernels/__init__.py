"""NumPy twins of `mlptrain.backends.numba_kernels`: same modules, names and signatures.

Every function writes into the output arrays it is given (no return value), so
the static graph in `mlptrain.nn` drives both backends with one code path.
"""

import warnings

from mlptrain.backends.numpy_kernels import conv, data, gemm, loss, optim, pool, precision, reduce, step_rules

__all__ = ["conv", "data", "gemm", "loss", "optim", "pool", "precision", "reduce", "step_rules"]

# A diverging run overflows here first: NumPy's RuntimeWarning (overflow, invalid value, with this
# package's file paths) would print before the loop's own one line, which names the step and the lr
# (mlptrain.training.monitor). The numba twins say nothing either.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"mlptrain\.backends\.numpy_kernels(\.|$)")
