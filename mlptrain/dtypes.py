"""Training precisions and the storage format of each.

fp32 trains in float32 throughout. fp16 and bf16 are mixed precision: fp32
master weights, gradients and optimizer state; activations and a compute copy
of the weights stored in the low format; every product summed in float32.
NumPy has no bfloat16 dtype, so bf16 values are stored as uint16 holding the
top half of the float32 bit pattern, on both backends.
"""

from __future__ import annotations

import numpy as np

STORAGE = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(np.uint16)}


def precision_of(dtype) -> str:
    """The precision whose storage dtype this is."""
    for name, storage in STORAGE.items():
        if np.dtype(dtype) == storage:
            return name
    raise ValueError(f"no precision stores values as {np.dtype(dtype)} (valid: float32, float16, uint16 for bf16)")


def bf16_from_float32(values) -> np.ndarray:
    """Round float32 to bfloat16 bit patterns, to nearest with ties to even; NaN stays a (quiet) NaN."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def float32_from_bf16(bits) -> np.ndarray:
    """The float32 values of bfloat16 bit patterns (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_float32(array) -> np.ndarray:
    """The values of an array in any storage format, as float32. float32 and float64 arrays are
    returned as they are: the NumPy kernels stay dtype-generic for them (gradient checks run in float64)."""
    if array.dtype == np.uint16:
        return float32_from_bf16(array)
    if array.dtype in (np.float32, np.float64):
        return array
    return array.astype(np.float32)


def from_float32(values, dtype) -> np.ndarray:
    """float32 values rounded to a storage format (round to nearest even, as the GPU converts)."""
    dtype = np.dtype(dtype)
    if dtype == np.uint16:
        return bf16_from_float32(values)
    with np.errstate(over="ignore"):  # beyond fp16's range is inf, as on the GPU: the loss scaler's signal
        return np.asarray(values, np.float32).astype(dtype)


def round_to_storage(values, dtype) -> np.ndarray:
    """float32 values as a storage format holds them, back in float32."""
    if np.dtype(dtype) == np.float32:
        return np.asarray(values, np.float32)
    return to_float32(from_float32(values, dtype))
