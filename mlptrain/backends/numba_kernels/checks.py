"""Argument checks shared by the kernel launchers.

A launcher refuses anything a kernel would silently misread: the wrong dtype,
rank or shape, a non-contiguous view, or a host array (which Numba would copy
to the device and back on every launch).
"""

import functools

import numpy as np

from mlptrain.backends.numba_kernels import current
from mlptrain.backends.numba_kernels.codecs import STORAGE_DTYPES


def require(name, array, dtype, shape):
    """Raise ValueError unless `array` is a C-contiguous device array of this
    dtype and shape (None in `shape` matches any length on that axis)."""
    _device_array_of(name, array, dtype, shape)
    if not array.is_c_contiguous():
        raise ValueError(f"{name} must be C-contiguous (a row slice buf[:n] is; a column slice is not)")


def require_lanes(name, array, dtype, shape):
    """Like `require` for an operand with a leading lane axis (packed trials, one per lane): shape[0] lanes,
    each lane's block C-contiguous, the lanes apart by any stride at least a block (a column range of a
    (lanes, n) buffer, `mlptrain.backends.lanes.lane_view`, is such an operand)."""
    _device_array_of(name, array, dtype, shape)
    got = tuple(array.shape)
    if not lanes_apart(got, tuple(array.strides), array.dtype.itemsize):
        raise ValueError(f"{name} must hold each lane's block C-contiguous, lanes apart by at least a block "
                         f"(strides {tuple(array.strides)} for shape {got})")


def _device_array_of(name, array, dtype, shape) -> None:
    """Raise ValueError unless `array` is a device array of this dtype and shape (None: any length)."""
    if isinstance(array, np.ndarray) or not hasattr(array, "is_c_contiguous"):
        raise ValueError(f"{name} must be a device array (backend.to_device), got {type(array).__name__}")
    if array.dtype != np.dtype(dtype):
        raise ValueError(f"{name} must be {np.dtype(dtype)}, got {array.dtype}")
    got = tuple(array.shape)
    if len(got) != len(shape) or any(want is not None and n != want for n, want in zip(got, shape)):
        want = tuple("*" if n is None else n for n in shape)
        raise ValueError(f"{name} has shape {got}, expected {want}")


def require_lanes_one_of(name, array, dtypes, shape):
    """`require_lanes`, accepting any of several dtypes (as `require_one_of` does for `require`)."""
    if array.dtype not in [np.dtype(d) for d in dtypes]:
        names = " or ".join(str(np.dtype(d)) for d in dtypes)
        raise ValueError(f"{name} must be {names}, got {array.dtype}")
    require_lanes(name, array, array.dtype, shape)


def lanes_apart(shape: tuple, strides: tuple, itemsize: int) -> bool:
    """Whether an array of `shape` and byte `strides` holds each block along the first axis C-contiguous and
    the blocks apart by at least a block (so that lanes never overlap)."""
    block = itemsize
    for n, stride in zip(reversed(shape[1:]), reversed(strides[1:])):
        if n > 1 and stride != block:
            return False
        block *= n
    return len(shape) == 0 or shape[0] <= 1 or strides[0] >= block


def require_one_of(name, array, dtypes, shape):
    """Like `require`, accepting any of several dtypes."""
    if array.dtype not in [np.dtype(d) for d in dtypes]:
        names = " or ".join(str(np.dtype(d)) for d in dtypes)
        raise ValueError(f"{name} must be {names}, got {array.dtype}")
    require(name, array, array.dtype, shape)


def checked_cursor(cursor):
    """The cursor a launch reads: the one given (a 1-element int64 device array), or a shared zero for
    launches given none (evaluation and tests walk through their arrays from the host)."""
    if cursor is None:
        return _zero_cursor(current.device())
    require("cursor", cursor, "int64", (1,))
    return cursor


def checked_lane_cursors(cursor, advance, lanes):
    """The lanes' cursors a launch moves on by `advance`: the ones given ((lanes, 1) int64, a lane view or a
    slab's rows), or, given none, a shared (1, 1) zero that a launch of advance 0 never reads."""
    if cursor is None:
        if advance != 0:
            raise ValueError("advance needs a cursor")
        return _zero_cursor(current.device()).reshape(1, 1)
    require_lanes("cursor", cursor, "int64", (lanes, 1))
    return cursor


@functools.cache
def _zero_cursor(device: int):
    """One per GPU: a sweep's threads train on several GPUs of one process, and a launch reads its own GPU's."""
    return current.to_device(np.zeros(1, np.int64))


def check_rows(offset, rows, row_loss_length, row_correct_length):
    """Rows offset..offset + rows of the per-sample results fit both arrays (a loss's launches)."""
    if offset < 0 or offset + rows > min(row_loss_length, row_correct_length):
        raise ValueError(
            f"rows {offset}..{offset + rows} do not fit row_loss ({row_loss_length}) "
            f"and row_correct ({row_correct_length})"
        )


def check_cross_entropy(logits, labels, dlogits, row_loss, row_correct, offset, loss_scale):
    """The rows of logits (M, C), after checking `softmax_cross_entropy`'s operands (loss.py's, and gemm's output
    layer fused with it)."""
    require_one_of("logits", logits, STORAGE_DTYPES, (None, None))
    rows, classes = logits.shape
    require("labels", labels, "int32", (rows,))
    require("dlogits", dlogits, logits.dtype, (rows, classes))
    require("row_loss", row_loss, "float32", (None,))
    require("row_correct", row_correct, "int32", (None,))
    require("loss_scale", loss_scale, "float64", (1,))
    if classes == 0:
        raise ValueError("logits must have at least one class column")
    check_rows(offset, rows, row_loss.shape[0], row_correct.shape[0])
    return rows
