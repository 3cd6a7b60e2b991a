"""Flat fp32 buffers with named views: parameters, gradients, optimizer state.

One allocation per buffer means zeroing, norms and optimizer updates are each
one launch over every parameter; the named views are what layers and
checkpoints see.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlptrain.errors import UserError


@dataclass(frozen=True)
class Layout:
    """Names, shapes and offsets of tensors packed into one flat buffer."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def offsets(self) -> tuple[int, ...]:
        out, total = [], 0
        for shape in self.shapes:
            out.append(total)
            total += math.prod(shape)
        return tuple(out)

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


class FlatBuffer:
    """A 1-D backend array and a reshaped view of it for every named tensor."""

    def __init__(self, backend, layout: Layout, dtype=np.float32):
        self.backend = backend
        self.layout = layout
        self.flat = backend.zeros((layout.size,), dtype)
        self.views = {}
        for name, shape, offset in zip(layout.names, layout.shapes, layout.offsets):
            self.views[name] = self.flat[offset:offset + math.prod(shape)].reshape(shape)

    def __getitem__(self, name):
        return self.views[name]

    def to_host_dict(self, prefix: str = "") -> dict[str, np.ndarray]:
        return self.split(self.backend.to_host(self.flat), prefix)

    def split(self, host: np.ndarray, prefix: str = "") -> dict[str, np.ndarray]:
        """`host`, a host copy of `flat` that the caller hands over, as one array per tensor (views of it), by
        name: not copied again (16 lanes' checkpoints of 670 K parameters each at a packed sweep's epoch end)."""
        return {
            prefix + name: host[offset:offset + math.prod(shape)].reshape(shape)
            for name, shape, offset in zip(self.layout.names, self.layout.shapes, self.layout.offsets)
        }

    def load_host_dict(self, arrays: dict[str, np.ndarray], prefix: str = "") -> None:
        """Fill every tensor from `arrays[prefix + name]`; raises UserError (a checkpoint of another model)
        unless the names under `prefix` and their shapes are exactly the layout's."""
        expected = {prefix + name: shape for name, shape in zip(self.layout.names, self.layout.shapes)}
        extra = sorted(key for key in arrays if key.startswith(prefix) and key not in expected)
        missing = [key for key in expected if key not in arrays]
        if missing or extra:
            raise UserError(f"the checkpoint's parameters do not match the model: "
                            f"missing {', '.join(missing) or 'none'}; unexpected {', '.join(extra) or 'none'}")
        for key, shape in expected.items():
            if np.shape(arrays[key]) != tuple(shape):
                raise UserError(f"the checkpoint's {key} has shape {np.shape(arrays[key])}, "
                                f"the model's is {tuple(shape)}")
        host = np.empty(self.layout.size, np.float32)
        for name, shape, offset in zip(self.layout.names, self.layout.shapes, self.layout.offsets):
            host[offset:offset + math.prod(shape)] = np.asarray(arrays[prefix + name]).reshape(-1)
        self.backend.copy_from_host(self.flat, host)
