"""Kernel parameters as numba packs them: each array 5 + 2 ndim slots (meminfo, parent, size, item size,
pointer, shape, strides in bytes), each scalar its C type, every slot 8 bytes. No GPU needed."""

import struct

import numpy as np
import pytest

from mlptrain.backends.driver import launch
from mlptrain.backends.driver.arrays import DeviceArray


def test_argument_types_are_numbas_names():
    a = DeviceArray(4096, (3, 5), np.float32)
    names = [launch.typename(v) for v in (a, 3, 2.5, True, np.float32(1), np.int32(2), np.uint64(3), np.bool_(0))]
    assert names == ["array(float32, 2d, C)", "int64", "float64", "bool", "float32", "int32", "uint64", "bool"]
    with pytest.raises(launch.Unlaunchable):
        launch.typename(np.zeros(3))  # a host array: numba would copy it at every launch


def test_slots_hold_what_numba_passes():
    a = DeviceArray(8192, (3, 5), np.float16)
    args = (a, np.float32(1.5), 7, True, 2.0)
    names = tuple(launch.typename(v) for v in args)
    packed = launch.layout(names).pack(*launch.values(args))
    assert len(packed) == 8 * (9 + 4)
    slots = [packed[i:i + 8] for i in range(0, len(packed), 8)]
    ints = [struct.unpack("<q", s)[0] for s in slots[:9]]
    assert ints == [0, 0, 15, 2, 8192, 3, 5, 10, 2]
    assert struct.unpack("<f", slots[9][:4])[0] == 1.5
    assert struct.unpack("<q", slots[10])[0] == 7
    assert slots[11][0] == 1
    assert struct.unpack("<d", slots[12])[0] == 2.0


def test_tuples_are_their_items_in_order():
    args = ((np.int32(4), 5),)
    names = tuple(launch.typename(v) for v in args)
    assert names == ("(int32, int64,)",)
    packed = launch.layout(names).pack(*launch.values(args))
    assert struct.unpack("<i4xq", packed) == (4, 5)
