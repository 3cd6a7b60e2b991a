"""Device arrays without numba: allocated with the driver, with the few operations the launchers and the
training code use (row slices, a row, reshape, a view as another dtype of the same size, copies to and from
the host), all over C-contiguous arrays; and lane views (mlptrain.backends.lanes), whose lanes are apart by
any stride, and their row slices and rows. Any library that reads `__cuda_array_interface__` (numba's kernels among
them, when a kernel must still be compiled) sees the same memory."""

from __future__ import annotations

import math
import weakref

import numpy as np

from mlptrain.backends.driver import api


class DeviceArray:
    """`shape` elements of `dtype` at device address `pointer`, C-contiguous unless given byte `strides` (a lane
    view's); `base` keeps the allocation alive for views."""

    __slots__ = ("pointer", "shape", "dtype", "base", "strides", "contiguous", "typename", "parameters", "__weakref__")

    def __init__(self, pointer: int, shape: tuple, dtype, base=None, strides: tuple | None = None):
        self.pointer = pointer
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.base = base
        packed = _c_strides(self.shape, self.dtype.itemsize)
        self.strides = packed if strides is None else tuple(int(n) for n in strides)
        # asked at every launch's checks: known once
        self.contiguous = strides is None or all(n <= 1 or got == want for n, got, want in
                                                  zip(self.shape, self.strides, packed))
        # numba's name for its type: a layout of "A" (any strides) where the array is not C-contiguous
        layout = "C" if self.contiguous else "A"
        self.typename = f"array({self.dtype}, {len(self.shape)}d, {layout})"
        # what a launch passes for it, as numba does (meminfo, parent, size, item size, pointer, shape, strides),
        # made once: an array is launched many times
        self.parameters = (0, 0, self.size, self.dtype.itemsize, pointer, *self.shape, *self.strides)

    @classmethod
    def allocate(cls, shape, dtype) -> DeviceArray:
        shape = tuple(int(n) for n in np.atleast_1d(shape)) if not isinstance(shape, int) else (shape,)
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        api.ensure_context()
        pointer = api.allocate(nbytes)
        owner = _Allocation(pointer)
        # no free at exit: the driver frees a process's memory with its context (see backends.cuda)
        weakref.finalize(owner, api.free, pointer, api.current_context()).atexit = False
        return cls(pointer, shape, dtype, owner)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self):
        return self.shape[0]

    def is_c_contiguous(self) -> bool:
        return self.contiguous

    def strided(self, byte_offset: int, shape: tuple, strides: tuple) -> DeviceArray:
        """A view of this array's memory from `byte_offset` with its own shape and byte strides (a lane view)."""
        return DeviceArray(self.pointer + byte_offset, shape, self.dtype, self._owner(), strides)

    def __getitem__(self, index):
        """Row slices (`a[i:j]`) and one row (`a[i]`): a C-contiguous array's views stay C-contiguous, a lane
        view's keep its strides (a row of one is its lane's block, C-contiguous)."""
        if isinstance(index, (int, np.integer)) and self.shape:
            row = int(index) + self.shape[0] if index < 0 else int(index)
            if not 0 <= row < self.shape[0]:
                raise IndexError(f"row {index} of a device array of {self.shape[0]} rows")
            return DeviceArray(self.pointer + row * self.strides[0], self.shape[1:], self.dtype, self._owner(),
                               None if self.contiguous else self.strides[1:])
        if not isinstance(index, slice) or index.step not in (None, 1) or not self.shape:
            raise TypeError("a device array takes row slices a[i:j] or a row a[i] only")
        start, stop, _ = index.indices(self.shape[0])
        stop = max(start, stop)
        return DeviceArray(self.pointer + start * self.strides[0], (stop - start,) + self.shape[1:], self.dtype,
                           self._owner(), None if self.contiguous else self.strides)

    def reshape(self, *shape) -> DeviceArray:
        self._contiguous("reshaped")
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if -1 in shape:
            known = math.prod(n for n in shape if n != -1)
            shape = tuple(self.size // max(known, 1) if n == -1 else n for n in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape a device array of {self.size} elements into {tuple(shape)}")
        return DeviceArray(self.pointer, shape, self.dtype, self._owner())

    def view(self, dtype) -> DeviceArray:
        """The same bytes as another dtype, as numpy views them: a different item size changes the last axis
        (a 16-bit array seen as uint32 pairs along it, for the tensor cores)."""
        self._contiguous("viewed as another dtype")
        dtype = np.dtype(dtype)
        shape = self.shape
        if dtype.itemsize != self.dtype.itemsize:
            row = (shape[-1] if shape else 1) * self.dtype.itemsize
            if not shape or row % dtype.itemsize:
                raise ValueError(f"a device array of shape {shape} and {self.dtype} cannot be viewed as {dtype}: "
                                 "its last axis does not divide into whole items")
            shape = shape[:-1] + (row // dtype.itemsize,)
        return DeviceArray(self.pointer, shape, dtype, self._owner())

    def _owner(self):
        return self.base if self.base is not None else self

    def _contiguous(self, what: str) -> None:
        if not self.is_c_contiguous():
            raise TypeError(f"a lane view (strides {self.strides}) cannot be {what}; use the lanes' own arrays")

    def copy_to_host(self, stream=0) -> np.ndarray:
        host = np.empty(self.shape, self.dtype)
        self.copy_into(host, stream)
        return host

    def copy_into(self, host: np.ndarray, stream=0) -> None:
        """Queue a copy into `host` (C-contiguous, of this array's shape and dtype: page-locked memory, for the
        copy to run behind the host's back; mlptrain.backends.host_copies). A lane view of one axis (its lanes'
        rows apart, each contiguous: mlptrain.backends.lanes) is copied row by row, in one copy."""
        if host.shape != self.shape or host.dtype != self.dtype or not host.flags.c_contiguous:
            raise ValueError(f"copying a {self.shape} {self.dtype} device array into a {host.shape} {host.dtype} one")
        if not self.is_c_contiguous() and len(self.shape) == 2 and self.strides[1] == self.dtype.itemsize:
            api.rows_to_host(host.ctypes.data, self.pointer, self.shape[1] * self.dtype.itemsize, self.shape[0],
                             self.strides[0], stream)
            return
        self._contiguous("copied")
        api.to_host(host.ctypes.data, self.pointer, self.nbytes, stream)

    def copy_to_device(self, host, stream=0) -> None:
        self._contiguous("copied")
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if host.size != self.size:
            raise ValueError(f"copying {host.size} elements into a device array of {self.size}")
        api.to_device(self.pointer, host.ctypes.data, self.nbytes, stream)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False), "version": 3,
                "strides": None if self.is_c_contiguous() else self.strides, "stream": None}


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


class _Allocation:
    """What a device allocation's lifetime hangs on: freed when the last array over it goes."""

    __slots__ = ("pointer", "__weakref__")

    def __init__(self, pointer: int):
        self.pointer = pointer
