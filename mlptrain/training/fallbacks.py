"""Fallbacks: what runs instead of what was asked. Each prints one warning line on the console, and a
run records it in summary.json (`fallbacks`, a list of those lines).

The ones outside the kernels: `backend: auto` running on the CPU (mlptrain.backends.selection notes it), a dataset
smaller than the canonical one (below; e.g. `<root>/cifar10-subset/` used when `<root>/cifar10/` is
missing), a decoded-data cache that could not be read or written (mlptrain.data.decoded_cache), all warned
when training starts, after every refusal, so that bad input stays one line; and
CUDA graphs not captured on a CUDA backend (mlptrain.training.window), warned when the capture fails. Kernel
variants are the kernel plan's (mlptrain.backends.numba_kernels).
"""

from __future__ import annotations

from mlptrain.data.dataset import is_subset
from mlptrain.data.registry import BUILTIN
from mlptrain.util.console import warn

__all__ = ["is_subset", "subset_note", "warn"]  # warn: one warning line, its text for the `fallbacks` record


def subset_note(dataset) -> str | None:
    """The fallback line of a built-in dataset smaller than published (see mlptrain.data.dataset.is_subset), naming
    where it was read from, else None."""
    if not is_subset(dataset):
        return None
    train, test = BUILTIN[dataset.name].sizes
    where = f", from {dataset.provenance.location}" if dataset.provenance.location else ""
    return (f"data: {dataset.name} is a subset ({len(dataset.train_images):,} of {train:,} training and "
            f"{len(dataset.test_images):,} of {test:,} test images{where}); its metrics are not comparable with "
            "the full dataset's")
