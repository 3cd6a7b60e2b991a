"""Datasets: find, download, verify and decode them into an `ImageDataset`."""

from collections.abc import Callable
from pathlib import Path

from mlptrain.data.cifar10 import load_cifar10
from mlptrain.data.dataset import ImageDataset, default_data_root
from mlptrain.data.mnist import load_mnist
from mlptrain.errors import UserError

__all__ = ["ImageDataset", "default_data_root", "load_dataset", "DATASETS"]

# name -> loader(root): adding a dataset is one module and one entry here.
DATASETS: dict[str, Callable[[Path | None], ImageDataset]] = {
    "mnist": load_mnist,
    "cifar10": load_cifar10,
}


def load_dataset(name: str, root: Path | None = None) -> ImageDataset:
    """The dataset registered as `name`, read from under `root` (`<root>/<name>/`,
    see each loader; root defaults to `default_data_root()`). An unknown name
    raises `UserError` listing the valid ones."""
    try:
        loader = DATASETS[name]
    except KeyError:
        raise UserError(f"unknown dataset {name!r}; valid: {', '.join(sorted(DATASETS))}") from None
    return loader(root)
