"""Every CUDA kernel of mlptrain, one module per family, each kernel with its
launcher right under it (the launcher checks shapes and dtypes and computes
the grid; nothing else launches a kernel).

Launchers take device arrays (C-contiguous; a row slice `buf[:n]` of a
preallocated buffer is fine) and write into the outputs they are given, with
the same names and signatures as their twins in `mlptrain.backends.numpy_kernels`.
No kernel uses atomics: every output element has one owning thread, so results
are bitwise reproducible run to run on the same GPU.
"""

import importlib

__all__ = ["conv", "data", "gemm", "loss", "optim", "pool", "precision", "reduce", "step_rules"]


def __getattr__(name: str):
    """A family module, imported when a run first asks for it: an MLP never loads the convolutions' (56 ms)."""
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")  # also binds it here: asked once per family
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
