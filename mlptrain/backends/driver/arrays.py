"""Device arrays without numba: C-contiguous, allocated with the driver, with the few operations the
launchers and the training code use (row slices, reshape, a view as another dtype of the same size,
copies to and from the host). Any library that reads `__cuda_array_interface__` (numba's kernels among
them, when a kernel must still be compiled) sees the same memory."""

from __future__ import annotations

import math
import weakref

import numpy as np

from mlptrain.backends.driver import api


class DeviceArray:
    """`shape` elements of `dtype` at device address `pointer`, C-contiguous; `base` keeps the allocation alive
    for views."""

    __slots__ = ("pointer", "shape", "dtype", "base", "typename", "parameters", "__weakref__")

    def __init__(self, pointer: int, shape: tuple, dtype, base=None):
        self.pointer = pointer
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.base = base
        self.typename = f"array({self.dtype}, {len(self.shape)}d, C)"  # numba's name for its type
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

    @property
    def strides(self) -> tuple:
        strides, step = [], self.dtype.itemsize
        for n in reversed(self.shape):
            strides.append(step)
            step *= n
        return tuple(reversed(strides))

    def __len__(self):
        return self.shape[0]

    def is_c_contiguous(self) -> bool:
        return True

    def __getitem__(self, index):
        """Row slices only (`a[i:j]`): every view stays C-contiguous."""
        if not isinstance(index, slice) or index.step not in (None, 1) or not self.shape:
            raise TypeError("a device array takes row slices a[i:j] only")
        start, stop, _ = index.indices(self.shape[0])
        stop = max(start, stop)
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        return DeviceArray(self.pointer + start * row, (stop - start,) + self.shape[1:], self.dtype, self._owner())

    def reshape(self, *shape) -> DeviceArray:
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

    def copy_to_host(self, stream=0) -> np.ndarray:
        host = np.empty(self.shape, self.dtype)
        api.to_host(host.ctypes.data, self.pointer, self.nbytes, stream)
        return host

    def copy_to_device(self, host, stream=0) -> None:
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if host.size != self.size:
            raise ValueError(f"copying {host.size} elements into a device array of {self.size}")
        api.to_device(self.pointer, host.ctypes.data, self.nbytes, stream)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.pointer, False), "version": 3,
                "strides": None, "stream": None}


class _Allocation:
    """What a device allocation's lifetime hangs on: freed when the last array over it goes."""

    __slots__ = ("pointer", "__weakref__")

    def __init__(self, pointer: int):
        self.pointer = pointer
