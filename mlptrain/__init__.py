"""mlptrain: small-model training on hand-written Numba CUDA kernels."""

__version__ = "0.1.0"
