"""The CPU and CUDA backends behind one Protocol (protocol.py), their twin kernel sets (numpy_kernels/,
numba_kernels/) and the on-disk cache of compiled CUDA kernels (kernel_cache/). Nothing outside this folder
imports numba."""
