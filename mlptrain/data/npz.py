"""Your own data in one .npz file (`data.dataset: npz`, `data.path: FILE`), checked up front.

The file holds `x_train`, `y_train`, `x_test`, `y_test` and optionally `x_val`, `y_val`
(a validation split of its own, used instead of holding images out of x_train) and
`class_names` (strings). A file of `x_test` and `y_test` alone is test data: `mlptrain evaluate
RUN --data dataset=npz,path=FILE` reads it; training refuses it. Samples are images, uint8 of shape (N, H, W) or channels-last
(N, H, W, C) (any integer type with values in 0..255 is taken as uint8), or features,
floats of shape (N, D) (kept as float32; an MLP only). Labels are integer class indices.
Every problem is one `UserError` line naming the file and the array; nothing is pickled.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlptrain.config.suggestions import suggest_value
from mlptrain.data.dataset import PIXEL_SCALE, ImageDataset, Provenance, value_statistics
from mlptrain.data.download import md5sum
from mlptrain.errors import UserError
from mlptrain.util.npz_archive import open_npz
from mlptrain.util.user_paths import expand_user

REQUIRED = ("x_test", "y_test")
OPTIONAL = ("x_train", "y_train", "x_val", "y_val", "class_names")
MAX_CLASSES = 256  # labels live on the device as uint8
SAVE_HINT = "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"


def load_npz(path: str | Path) -> ImageDataset:
    """The dataset in the .npz at `path`; raises `UserError` for the first problem found."""
    path = expand_user(str(path), "data.path").resolve()
    arrays = _read(path)
    splits = [s for s in ("train", "val", "test") if f"x_{s}" in arrays]
    samples = {s: _samples(path, f"x_{s}", arrays[f"x_{s}"]) for s in splits}
    _check_alike(path, samples)
    labels = {s: _labels(path, s, arrays[f"y_{s}"], len(samples[s])) for s in splits}
    class_names = _class_names(path, arrays.get("class_names"))
    num_classes = _num_classes(path, labels, class_names)
    flat = {s: _flatten(x) for s, x in samples.items()}
    known = "train" if "train" in samples else "test"  # test data alone: its own statistics (see the docstring)
    x_known = samples[known]
    image_shape = (x_known.shape[1],) if x_known.ndim == 2 else (_channels(x_known), *x_known.shape[1:3])
    scale = PIXEL_SCALE if x_known.dtype == np.uint8 else 1.0
    mean, std = value_statistics(flat[known], scale, f"{path}: x_{known}")
    if known == "test":  # no training split: empty, of the test split's kind
        flat["train"], labels["train"] = flat["test"][:0], labels["test"][:0]
    return ImageDataset(
        name="npz", train_images=flat["train"], train_labels=labels["train"], test_images=flat["test"],
        test_labels=labels["test"], image_shape=image_shape, num_classes=num_classes, mean=mean, std=std,
        class_names=class_names, value_scale=scale, val_images=flat.get("val"), val_labels=labels.get("val"),
        provenance=Provenance(str(path), ((path.name, md5sum(path)),)),
    )


def _read(path: Path) -> dict[str, np.ndarray]:
    """Every array of the archive, by name, after checking the names."""
    if path.exists() and not path.is_file():  # a folder, a FIFO (reading one waits forever), a device
        raise UserError(f"data.path {path}: not a regular file; data.dataset npz reads a file written by {SAVE_HINT}")
    if not path.exists():
        raise UserError(f"data.path {path}: no such file (data.dataset npz reads a file written by {SAVE_HINT})")
    with open_npz(path, "npz dataset", f"save one with {SAVE_HINT}") as archive:
        _check_names(path, list(archive.files))
        return {name: _member(path, archive, name) for name in archive.files}


def _check_names(path: Path, names: list[str]) -> None:
    for name in names:
        if name not in REQUIRED + OPTIONAL:
            close = suggest_value(name.lower(), REQUIRED + OPTIONAL) if len(name) < 100 else None
            hint = f"did you mean '{close}'? " if close else ""
            raise UserError(f"{path}: unknown array '{name}'; {hint}(valid: {', '.join(REQUIRED + OPTIONAL)})")
    missing = [name for name in REQUIRED if name not in names]
    if missing:
        raise UserError(f"{path}: missing array{'s' if len(missing) > 1 else ''} {', '.join(missing)} (an npz "
                        f"dataset needs x_train, y_train, x_test, y_test, or x_test and y_test alone to evaluate "
                        f"on; this file has {', '.join(names) or 'none'})")
    for split in ("train", "val"):
        if (f"x_{split}" in names) != (f"y_{split}" in names):
            has, lacks = (f"x_{split}", f"y_{split}") if f"x_{split}" in names else (f"y_{split}", f"x_{split}")
            raise UserError(f"{path}: has {has} but no {lacks}; a {'training' if split == 'train' else 'validation'} "
                            "split needs both (or neither)")
    if "x_val" in names and "x_train" not in names:
        raise UserError(f"{path}: has a validation split but no training split (x_train, y_train); test data alone "
                        "is x_test and y_test")


def _member(path: Path, archive, name: str) -> np.ndarray:
    try:
        return archive[name]
    except ValueError as error:  # damage, which open_npz refuses, unless it is an object array
        if "allow_pickle" in str(error):
            raise UserError(f"{path}: array '{name}' holds Python objects, which are not loaded (unpickling can run "
                            f"code); save numbers as numeric arrays and names as np.array(names, dtype=str)") from None
        raise


def _samples(path: Path, name: str, x: np.ndarray) -> np.ndarray:
    """x as uint8 images (N, H, W[, C]) or float32 features (N, D); one line per problem."""
    valid = "uint8 images (N, H, W) or (N, H, W, C), or float features (N, D)"
    if x.ndim not in (2, 3, 4):
        raise UserError(f"{path}: {name} has shape {x.shape}; samples must be {valid}")
    if x.shape[0] == 0 or 0 in x.shape[1:]:
        raise UserError(f"{path}: {name} holds no samples (shape {x.shape})")
    if x.ndim == 4 and x.shape[1] <= 4 < x.shape[3]:
        raise UserError(f"{path}: {name} has shape {x.shape}, which looks channels-first; images must be "
                        f"channels-last (N, H, W, C): x.transpose(0, 2, 3, 1)")
    if x.dtype.kind in "iu":
        low, high = int(x.min()), int(x.max())
        if low < 0 or high > 255:
            raise UserError(f"{path}: {name} holds values {low}..{high}; integer samples are pixels and must be "
                            f"in 0..255 (scale them, or save float features)")
        return x.astype(np.uint8, copy=False)
    if x.dtype.kind != "f":
        raise UserError(f"{path}: {name} has dtype {x.dtype}; samples must be {valid}")
    if x.ndim != 2:
        raise UserError(f"{path}: {name} is {x.dtype} of shape {x.shape}; float data must be features (N, D) "
                        f"(x.reshape(len(x), -1)), images uint8 in 0..255")
    _check_finite(path, name, x)
    with np.errstate(over="ignore"):  # an overflow becomes inf, reported just below
        features = x.astype(np.float32, copy=False)
    if x.dtype != np.float32:
        _check_finite(path, name, features, " after conversion to float32 (|value| > 3.4e38)")
    return features


def _check_finite(path: Path, name: str, x: np.ndarray, cause: str = "") -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        row, column = np.argwhere(bad)[0]
        raise UserError(f"{path}: {name} holds {x[row, column]} (sample {row}, feature {column}){cause}; "
                        f"every value must be finite: drop or replace NaN and infinite values")


def _check_alike(path: Path, samples: dict[str, np.ndarray]) -> None:
    """Every split holds the same kind of sample (pixels or features) of the same shape."""
    train = samples.get("train", samples["test"])  # test data alone: nothing to compare
    for split, x in samples.items():
        if x.dtype != train.dtype:
            kinds = {np.dtype(np.uint8): "uint8 pixels", np.dtype(np.float32): "float features"}
            raise UserError(f"{path}: x_{split} holds {kinds[x.dtype]}, x_train {kinds[train.dtype]}; "
                            f"every split needs the same kind")
        if x.shape[1:] != train.shape[1:]:
            raise UserError(f"{path}: x_{split} samples have shape {x.shape[1:]}, x_train's {train.shape[1:]}; "
                            f"every split needs the same shape")


def _labels(path: Path, split: str, y: np.ndarray, count: int) -> np.ndarray:
    name = f"y_{split}"
    if y.dtype.kind not in "iu":
        raise UserError(f"{path}: {name} has dtype {y.dtype}; labels must be integers, the class indices 0..K-1")
    if y.ndim != 1:
        one_hot = " (one-hot? save y.argmax(1))" if y.ndim == 2 else ""
        raise UserError(f"{path}: {name} has shape {y.shape}; labels must be one class index per sample, "
                        f"shape ({count},){one_hot}")
    if len(y) != count:
        raise UserError(f"{path}: {name} has {len(y)} labels but x_{split} {count} samples; they must match")
    if y.min() < 0:
        raise UserError(f"{path}: {name} holds label {y.min()}; labels are class indices 0..K-1")
    if y.max() >= MAX_CLASSES:
        raise UserError(f"{path}: {name} holds label {y.max()}; at most {MAX_CLASSES} classes (labels 0..255)")
    return y.astype(np.uint8)


def _class_names(path: Path, names: np.ndarray | None) -> tuple[str, ...]:
    if names is None:
        return ()
    if names.dtype.kind not in "US" or names.ndim != 1 or len(names) == 0:
        raise UserError(f"{path}: class_names must be a 1-D array of strings (np.array(names, dtype=str)), "
                        f"got {names.dtype} {names.shape}")
    if len(names) > MAX_CLASSES:
        raise UserError(f"{path}: class_names names {len(names)} classes; at most {MAX_CLASSES}")
    return tuple(n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names.tolist())


def _num_classes(path: Path, labels: dict[str, np.ndarray], class_names: tuple[str, ...]) -> int:
    """len(class_names) when given (every label must be below it), else the largest label + 1."""
    largest = max(int(y.max()) for y in labels.values())
    if class_names and largest >= len(class_names):
        split = next(s for s, y in labels.items() if y.max() == largest)
        raise UserError(f"{path}: y_{split} holds label {largest} but class_names names {len(class_names)} classes "
                        f"(labels 0..{len(class_names) - 1})")
    return len(class_names) or largest + 1


def _channels(x: np.ndarray) -> int:
    return x.shape[3] if x.ndim == 4 else 1


def _flatten(x: np.ndarray) -> np.ndarray:
    """(N, D) C-contiguous rows: images as channel planes in turn (the CHW order every dataset keeps)."""
    if x.ndim == 4:
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x.reshape(len(x), -1))
