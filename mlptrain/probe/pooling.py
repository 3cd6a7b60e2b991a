"""The autoencoder's latent pooled over a G x G grid of regions before a linear classifier, as Coates
and Ng (2011) pool their features over the four quadrants of an image: each region's average (or
maximum) per channel, a (G, G, C) feature in place of the latent's (h, w, C).

Regions split the latent's rows and columns as evenly as they can (the edges of region i are
floor(i * h / G) and floor((i + 1) * h / G)), so they never overlap and cover every position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlptrain.errors import UserError

MODES = ("avg", "max")
DEFAULT_GRID = 2  # Coates and Ng's quadrants


@dataclass(frozen=True)
class GridPool:
    mode: str
    grid: int

    def describe(self) -> str:
        return f"{self.mode} {self.grid}x{self.grid}"

    def width(self, latent_shape: tuple[int, int, int]) -> int:
        return self.grid * self.grid * latent_shape[2]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """(N, h, w, C) -> (N, G * G * C) float32, in (region row, region column, channel) order."""
        n, h, w, c = x.shape
        if not 1 <= self.grid <= min(h, w):
            raise ValueError(f"a {self.grid}x{self.grid} grid over a {h}x{w} latent")
        rows, cols = _edges(h, self.grid), _edges(w, self.grid)
        out = np.empty((n, self.grid, self.grid, c), np.float32)
        for i in range(self.grid):
            for j in range(self.grid):
                region = x[:, rows[i]:rows[i + 1], cols[j]:cols[j + 1], :]
                out[:, i, j, :] = region.mean(axis=(1, 2), dtype=np.float64) if self.mode == "avg" else \
                    region.max(axis=(1, 2))
        return out.reshape(n, -1)


def _edges(size: int, grid: int) -> list[int]:
    return [i * size // grid for i in range(grid + 1)]


def grid_pool(mode: str | None, grid: int | None, layer: str) -> GridPool | None:
    """The pooling `--pool` and `--grid` ask for (None for none); raises UserError on a bad mode, a grid
    without a mode, or a layer that is not the autoencoder's latent."""
    if mode is None:
        if grid is not None:
            raise UserError(f"--grid {grid}: pooling needs --pool avg or --pool max")
        return None
    if mode not in MODES:
        raise UserError(f"--pool {mode}: use avg or max")
    if layer != "latent":
        raise UserError(f"--pool pools the autoencoder's latent over a grid of regions; the {layer} layer has no "
                        "grid (use --layer latent of a conv_autoencoder run)")
    return GridPool(mode, DEFAULT_GRID if grid is None else grid)


def check_grid(pool: GridPool, latent_shape: tuple[int, int, int]) -> None:
    h, w, _ = latent_shape
    if not 1 <= pool.grid <= min(h, w):
        raise UserError(f"--grid {pool.grid}: the run's latent is {h}x{w}; use a grid of 1 to {min(h, w)}")
