"""The CUDA driver without numba: device arrays, streams and launches of already compiled kernels through
`cuda.bindings` (16 ms to import where numba takes 0.6 s). numba compiles (kernel_cache); this folder runs
what it compiled."""
