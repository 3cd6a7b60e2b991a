"""Conversions from float32 to each storage format (NumPy backend)."""

from mlptrain.dtypes import from_float32


def cast(src, dst):
    """dst = src rounded to dst's storage format (float32 src, 1-D)."""
    dst[...] = from_float32(src, dst.dtype)
