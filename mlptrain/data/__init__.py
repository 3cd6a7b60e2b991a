"""Datasets: find, download, verify and decode them into an `ImageDataset`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mlptrain.data.cifar import load_cifar
from mlptrain.data.dataset import ImageDataset, dataset_record, default_data_root, is_subset, recorded_dataset
from mlptrain.data.image_folder import load_image_folder
from mlptrain.data.mnist_family import load_mnist_family
from mlptrain.data.npz import load_npz
from mlptrain.data.registry import BUILTIN, BuiltinDataset
from mlptrain.errors import UserError

__all__ = ["ImageDataset", "default_data_root", "dataset_record", "is_subset", "load_dataset", "recorded_dataset",
           "DATASETS"]

Loader = Callable[..., ImageDataset]  # (root, path=..., label=..., image_size=...) -> ImageDataset


def _builtin(spec: BuiltinDataset) -> Loader:
    def load(root: Path | None = None, path: str | None = None, label: str | None = None,
             image_size: tuple[int, int] | None = None) -> ImageDataset:
        if image_size is not None:
            raise UserError(f"data.image_size resizes the images of data.dataset folder; {spec.name} has its own "
                            "size: drop data.image_size")
        if path is not None:
            raise UserError(f"data.path is for data.dataset npz or folder; {spec.name} is read from "
                            f"data.root (or MLPTRAIN_DATA_DIR): drop data.path")
        if label is not None and label not in [s.label for s in spec.label_sets]:
            sets = [s.label for s in spec.label_sets if s.label]
            valid = f"one of {', '.join(sets)}" if sets else "left out: it has one set of labels"
            raise UserError(f"data.label: {spec.name} has no '{label}' labels; data.label must be {valid}")
        if spec.layout == "idx":
            return load_mnist_family(spec, root)
        return load_cifar(spec, root, label)
    return load


def _user(name: str, read: Callable[..., ImageDataset], what: str, resizes: bool = False) -> Loader:
    def load(root: Path | None = None, path: str | None = None, label: str | None = None,
             image_size: tuple[int, int] | None = None) -> ImageDataset:
        if path is None:
            raise UserError(f"data.dataset {name} needs data.path: {what}")
        if label is not None:
            raise UserError(f"data.label chooses CIFAR-100's fine or coarse labels; drop it for data.dataset {name}")
        if image_size is not None and not resizes:
            raise UserError(f"data.image_size resizes the images of data.dataset folder; drop it for data.dataset "
                            f"{name}")
        return read(path, image_size) if resizes else read(path)
    return load


# name -> loader: the built-in table's entries, then the formats a user brings.
DATASETS: dict[str, Loader] = {
    **{name: _builtin(spec) for name, spec in BUILTIN.items()},
    "npz": _user("npz", load_npz, "the .npz file (x_train, y_train, x_test, y_test), e.g. data.path=my.npz"),
    "folder": _user("folder", load_image_folder, "a folder holding train/<class>/*.png and test/<class>/*.png",
                    resizes=True),
}


def load_dataset(name: str, root: Path | None = None, path: str | None = None,
                 label: str | None = None, image_size: tuple[int, int] | None = None) -> ImageDataset:
    """The dataset `name`: a built-in one read from under `root` (`<root>/<name>/`, see each loader;
    root defaults to `default_data_root()`), or a user's file or folder at `path` (npz, folder);
    `label` picks CIFAR-100's fine or coarse labels, `image_size` the size a folder's images are resized
    to. An unknown name raises `UserError` listing the valid ones."""
    try:
        loader = DATASETS[name]
    except KeyError:
        raise UserError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}") from None
    return loader(root, path=path, label=label, image_size=image_size)
