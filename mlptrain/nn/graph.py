"""What every model graph shares: float32 parameters with a compute copy, and row views of its buffers."""

from __future__ import annotations

import numpy as np


class StaticGraph:
    """Subclasses set backend, params, compute (params itself in fp32), max_rows and _views, and
    implement _make_views(rows)."""

    def load_parameters(self, arrays: dict[str, np.ndarray], prefix: str = "") -> None:
        """Set the float32 parameters (and refresh their compute copy) from host arrays by name."""
        self.params.load_host_dict(arrays, prefix)
        if self.compute is not self.params:
            self.backend.kernels.precision.cast(self.params.flat, self.compute.flat)

    def views(self, rows: int):
        """Row slices of every buffer for a batch of `rows`, cached so the step loop allocates nothing."""
        if rows not in self._views:
            if not 1 <= rows <= self.max_rows:
                raise ValueError(f"batch of {rows} rows; the graph holds 1..{self.max_rows}")
            self._views[rows] = self._make_views(rows)
        return self._views[rows]
