"""What every model graph shares: float32 parameters with a compute copy, and row views of its buffers."""

from __future__ import annotations

import numpy as np

from mlptrain.nn.init import init_layers, seeded_layers


class StaticGraph:
    """Subclasses set backend, layout (`<layer>.weight`, `<layer>.bias` pairs), params, compute (params
    itself in fp32), max_rows and _views, and implement _make_views(rows)."""

    def init_parameters(self, rng: np.random.Generator, weights: str, biases: str) -> None:
        """Draw every layer's weight and bias from the `model.init` schemes (mlptrain.nn.init), in layout
        order: the same seed gives the same parameters."""
        self.load_parameters(init_layers(rng, self._weight_layers(), weights, biases))

    def init_seeded(self, seed: int, weights: str, biases: str) -> None:
        """`init_parameters` with the generator of `seed` (np.random.default_rng(seed)), its draws kept for the
        next model of the seed (mlptrain.nn.init.seeded_layers)."""
        self.load_parameters(seeded_layers(seed, self._weight_layers(), weights, biases))

    def _weight_layers(self) -> list[tuple[str, tuple]]:
        return [(name.removesuffix(".weight"), tuple(shape)) for name, shape in zip(self.layout.names,
                                                                                    self.layout.shapes)
                if name.endswith(".weight")]

    def load_parameters(self, arrays: dict[str, np.ndarray], prefix: str = "") -> None:
        """Set the float32 parameters (and refresh their compute copy) from host arrays by name."""
        self.params.load_host_dict(arrays, prefix)
        if self.compute is not self.params:
            self.backend.kernels.precision.cast(self.params.flat, self.compute.flat)

    def forward_loss(self, rows: int, row_loss, row_correct, offset: int, grad_scale: float, loss_scale,
                     cursor=None) -> None:
        """`forward`, then `loss` with these arguments: one call, for a model that fuses its last layer with
        its loss (the MLP's output layer on the narrow engine)."""
        self.forward(rows)
        self.loss(rows, row_loss, row_correct, offset, grad_scale, loss_scale, cursor)

    def train_pass(self, rows: int, row_loss, row_correct, offset: int, grad_scale: float, loss_scale, cursor,
                   beta: float) -> None:
        """A batch's training pass: `forward_loss` with these arguments, then `backward(rows, beta)`; a model may
        fuse across the two (the MLP's output layer takes its input gradient in its loss's launch)."""
        self.forward_loss(rows, row_loss, row_correct, offset, grad_scale, loss_scale, cursor)
        self.backward(rows, beta)

    def views(self, rows: int):
        """Row slices of every buffer for a batch of `rows`, cached so the step loop allocates nothing."""
        if rows not in self._views:
            if not 1 <= rows <= self.max_rows:
                raise ValueError(f"batch of {rows} rows; the graph holds 1..{self.max_rows}")
            self._views[rows] = self._make_views(rows)
        return self._views[rows]
