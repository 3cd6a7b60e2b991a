"""Lane views: one tensor of every packed trial at once, as an operand with a leading lane axis.

Packed trials of one shape keep each buffer as one (lanes, n) array, lane k holding trial k's (its flat
parameters, its step state, ...; mlptrain.packing.lane_group). A layer's weights are then a range of
columns of every lane: `lane_view(slab, offset, shape)` sees them as a (lanes, *shape) array whose lane k
is slab[k, offset:offset + prod(shape)] reshaped, each lane's block C-contiguous and the lanes a row of
`slab` apart. The kernels' lane-axis launchers take such operands (numba_kernels.checks.require_lanes).
It works on every array kind a backend makes: NumPy's, the driver path's, numba's and the simulator's.
"""

from __future__ import annotations

import math

import numpy as np


def lane_view(slab, offset: int, shape: tuple):
    """The (lanes, *shape) view of `slab` (lanes, n) whose lane k is slab[k, offset:offset + prod(shape)]."""
    shape = tuple(int(n) for n in shape)
    lanes, width = tuple(slab.shape)
    size = math.prod(shape)
    if offset < 0 or offset + size > width:
        raise ValueError(f"columns {offset}..{offset + size} are outside a slab of {width}")
    itemsize = np.dtype(slab.dtype).itemsize
    block = [itemsize]  # C strides of one lane's block, built from its last axis
    for n in reversed(shape[1:]):
        block.insert(0, block[0] * n)
    strides = (int(slab.strides[0]), *block[:len(shape)])
    return _VIEWS[_kind(slab)](slab, offset * itemsize, (lanes, *shape), strides)


def _kind(array) -> str:
    if isinstance(array, np.ndarray):
        return "numpy"
    if hasattr(array, "_ary"):  # the simulator's FakeCUDAArray wraps a NumPy array
        return "simulator"
    if hasattr(array, "gpu_data"):
        return "numba"
    return "driver"


def _numpy_view(slab, byte_offset, shape, strides):
    return np.lib.stride_tricks.as_strided(slab[:, byte_offset // slab.itemsize:], shape, strides)


def _simulator_view(slab, byte_offset, shape, strides):
    return type(slab)(_numpy_view(slab._ary, byte_offset, shape, strides), slab.stream)


def _numba_view(slab, byte_offset, shape, strides):
    return type(slab)(shape, strides, slab.dtype, slab.stream, gpu_data=slab.gpu_data.view(byte_offset))


def _driver_view(slab, byte_offset, shape, strides):
    return slab.strided(byte_offset, shape, strides)


_VIEWS = {"numpy": _numpy_view, "simulator": _simulator_view, "numba": _numba_view, "driver": _driver_view}
