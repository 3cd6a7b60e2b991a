"""The driver path's device arrays: views keep C order and the allocation alive, as numpy would shape them.
No GPU needed: a view only computes addresses and shapes (nothing is allocated here)."""

import numpy as np
import pytest

from mlptrain.backends.driver.arrays import DeviceArray


def fake(shape, dtype=np.float32, pointer=4096):
    return DeviceArray(pointer, shape, dtype, base=object())


def test_row_slices_move_the_pointer_like_numpy():
    a = fake((5, 3, 2))
    host = np.zeros((5, 3, 2), np.float32)
    for index in (slice(1, 4), slice(None, 2), slice(3, None), slice(-2, None), slice(4, 2), slice(0, 99)):
        view, expected = a[index], host[index]
        assert view.shape == expected.shape
        offset = (expected.__array_interface__["data"][0] - host.__array_interface__["data"][0]) if expected.size else None
        if offset is not None:
            assert view.pointer == a.pointer + offset
        assert view.base is a.base and view.strides == expected.strides and view.typename == "array(float32, 3d, C)"


def test_only_row_slices_and_rows_are_made():
    a = fake((4, 6))
    for index in ((slice(None), slice(0, 3)), slice(0, 4, 2), 2.0):
        with pytest.raises(TypeError, match="row slices"):
            a[index]
    row = a[2]
    assert (row.shape, row.pointer, row.typename) == ((6,), a.pointer + 2 * 6 * 4, "array(float32, 1d, C)")
    assert a[-1].pointer == a.pointer + 3 * 6 * 4
    with pytest.raises(IndexError, match="row 4"):
        a[4]


def test_a_lane_view_carries_its_strides_to_numba_and_the_launch():
    """lanes.lane_view of a (3, 50) slab: columns 5..16 of every row as (3, 2, 6), the lanes a row apart."""
    from mlptrain.backends.lanes import lane_view

    slab = fake((3, 50))
    view = lane_view(slab, 5, (2, 6))
    expected = np.lib.stride_tricks.as_strided(np.zeros((3, 50), np.float32)[:, 5:], (3, 2, 6), (200, 24, 4))
    assert view.shape == expected.shape and view.strides == expected.strides == (200, 24, 4)
    assert view.pointer == slab.pointer + 5 * 4 and view.base is slab.base
    assert not view.is_c_contiguous() and view.typename == "array(float32, 3d, A)"
    assert view.parameters[-6:] == (3, 2, 6, 200, 24, 4)  # shape then strides, as numba passes an array
    assert view.__cuda_array_interface__["strides"] == (200, 24, 4)
    for refused in (lambda: view.reshape(36), lambda: view.copy_to_host()):
        with pytest.raises(TypeError, match="lane view"):
            refused()
    lane = view[2]  # a lane's block: C-contiguous, where numpy puts it
    assert (lane.shape, lane.pointer, lane.typename) == ((2, 6), view.pointer + 400, "array(float32, 2d, C)")
    first = view[:2]  # the first lanes (a step of fewer lanes than the group's): the lane view's strides
    assert first.shape == (2, 2, 6) and first.strides == (200, 24, 4) and first.pointer == view.pointer
    assert view[1:].pointer == view.pointer + 200 and view[1:].typename == "array(float32, 3d, A)"
    whole = lane_view(fake((1, 50)), 5, (2, 6))  # one lane: C-contiguous whatever its row stride
    assert whole.is_c_contiguous() and whole.typename == "array(float32, 3d, C)"


def test_reshape_and_views_follow_numpy():
    a = fake((4, 6), np.float16)
    host = np.zeros((4, 6), np.float16)
    assert a.reshape(3, 8).shape == host.reshape(3, 8).shape
    assert a.reshape((2, -1)).shape == host.reshape((2, -1)).shape == (2, 12)
    assert a.reshape(24).strides == (2,)
    with pytest.raises(ValueError, match="cannot reshape"):
        a.reshape(5, 5)
    assert a.view(np.uint16).shape == (4, 6) and a.view(np.uint16).dtype == np.uint16
    pairs = a.view(np.uint32)  # the tensor cores' pairs along the last axis
    assert pairs.shape == host.view(np.uint32).shape == (4, 3) and pairs.pointer == a.pointer
    with pytest.raises(ValueError, match="whole items"):
        fake((4, 5), np.float16).view(np.uint32)


def test_the_array_interface_describes_the_same_memory():
    a = fake((3, 4), np.uint16, pointer=1 << 20)[1:]
    interface = a.__cuda_array_interface__
    assert interface["shape"] == (2, 4) and interface["typestr"] == np.dtype(np.uint16).str
    assert interface["data"] == ((1 << 20) + 4 * 2, False) and interface["strides"] is None
    assert a.size == 8 and a.nbytes == 16 and len(a) == 2 and a.ndim == 2 and a.is_c_contiguous()


def test_the_quad_checks_read_a_device_arrays_own_pointer():
    """numba_kernels.wide decides on the host whether an operand is read four floats an access: every row 16-byte
    aligned (and, for a tile's rows, whole quads long)."""
    from mlptrain.backends.lanes import lane_view
    from mlptrain.backends.numba_kernels import wide

    padded = lane_view(fake((3, 8)), 0, (6,))  # rows of 6, 32 bytes apart
    assert wide.aligned_quads(padded) and not wide.aligned_rows(padded)  # no whole quads in a row
    assert not wide.aligned_quads(fake((4, 6)))  # rows 24 bytes apart
    assert wide.aligned_rows(fake((4, 8))) and wide.aligned_rows(fake((2, 4, 8)))
    assert not wide.aligned_quads(fake((4, 8), pointer=4100))  # 4 bytes off
    assert not wide.aligned_quads(fake((4, 8), np.float16))
    assert wide.aligned_rows(lane_view(fake((3, 52)), 4, (2, 8)))  # lanes 208 bytes apart, 16 bytes in
    assert not wide.aligned_rows(lane_view(fake((3, 50)), 4, (2, 8)))  # lanes 200 bytes apart
