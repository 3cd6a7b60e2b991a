"""The CPU and CUDA backends behind one Protocol (protocol.py), their twin kernel sets (numpy_kernels/,
numba_kernels/), the on-disk cache of compiled CUDA kernels (kernel_cache/) and the CUDA driver without numba
(driver/), which launches cached kernels. Nothing outside this folder imports numba."""
