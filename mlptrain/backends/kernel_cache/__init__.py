"""Compiled CUDA kernels kept on disk, keyed by everything that changes their machine code, and shared by every
process."""
