"""Fallbacks: what runs instead of what was asked. Each prints one warning line on the console, and a
run records it in summary.json (`fallbacks`, a list of those lines).

The ones outside the kernels: `backend: auto` running on the CPU (mlptrain.backend notes it), a dataset
smaller than the canonical one (below; e.g. `<root>/cifar10-subset/` used when `<root>/cifar10/` is
missing), both warned when training starts, after every refusal, so that bad input stays one line; and
CUDA graphs not captured on a CUDA backend (mlptrain.window), warned when the capture fails. Kernel
variants are the kernel plan's (mlptrain.numba_kernels).
"""

from __future__ import annotations

from mlptrain.tracking import console

# (training images, test images) of each dataset as published: fewer means a subset
CANONICAL_SIZES = {"mnist": (60_000, 10_000), "cifar10": (50_000, 10_000)}


def warn(note: str) -> str:
    """Print `note` as one warning line; returns it, for the run's `fallbacks` record."""
    console.print(f"[bold yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
    return note


def is_subset(dataset) -> bool | None:
    """Whether `dataset` holds fewer images than its canonical version (None: not a known dataset)."""
    canonical = CANONICAL_SIZES.get(dataset.name)
    if canonical is None:
        return None
    return len(dataset.train_images) < canonical[0] or len(dataset.test_images) < canonical[1]


def subset_note(dataset) -> str | None:
    """The fallback line of a dataset smaller than its canonical version, else None."""
    if not is_subset(dataset):
        return None
    train, test = CANONICAL_SIZES[dataset.name]
    return (f"data: {dataset.name} is a subset ({len(dataset.train_images):,} of {train:,} training and "
            f"{len(dataset.test_images):,} of {test:,} test images); its metrics are not comparable with the "
            "full dataset's")
