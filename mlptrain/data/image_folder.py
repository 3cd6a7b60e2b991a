"""Your own images in class folders (`data.dataset: folder`, `data.path: DIR`), read with Pillow:

    DIR/train/<class>/*.png   (also .jpg, .jpeg, .bmp)
    DIR/test/<class>/*.png

the ImageFolder layout. Classes are the train/ sub-folders in sorted order; test/ may
lack some, not add any. Every image must have the size and channels of the first
(grayscale: 1 channel, RGB: 3); nothing is resized or converted lossily. Every
problem is one `UserError` line naming the file or folder.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path

import numpy as np

from mlptrain.data.dataset import PIXEL_SCALE, ImageDataset, Provenance, value_statistics
from mlptrain.data.download import read_bytes
from mlptrain.errors import UserError
from mlptrain.util.user_paths import expand_user

EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp")
# Pillow mode -> the lossless mode it is read as; others (alpha, 16-bit, CMYK) are refused.
MODES = {"L": "L", "1": "L", "RGB": "RGB", "P": "RGB"}
LAYOUT = "DIR/train/<class>/*.png and DIR/test/<class>/*.png"


def load_image_folder(path: str | Path) -> ImageDataset:
    """The dataset in the folder at `path` (see the module docstring)."""
    root = expand_user(str(path), "data.path").resolve()
    for split in ("train", "test"):
        if not (root / split).is_dir():
            raise UserError(f"data.path {root}: no {split}/ folder; data.dataset folder reads {LAYOUT}")
    classes = _class_folders(root / "train")
    if not classes:
        raise UserError(f"{root / 'train'}: no class folders; data.dataset folder reads {LAYOUT}")
    for name in _class_folders(root / "test"):
        if name not in classes:
            raise UserError(f"{root / 'test' / name}: class '{name}' has no folder in {root / 'train'}; "
                            f"the classes are the train/ folders ({', '.join(classes)})")
    checksums, arrays, shape = [], {}, None
    for split in ("train", "test"):
        images, labels, shape = _read_split(root, split, classes, shape, checksums)
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = images, labels
    channels = shape[2] if len(shape) == 3 else 1
    mean, std = value_statistics(arrays["train_images"], PIXEL_SCALE, f"{root / 'train'}")
    return ImageDataset(name="folder", image_shape=(channels, shape[0], shape[1]), num_classes=len(classes),
                        mean=mean, std=std, class_names=tuple(classes),
                        provenance=Provenance(str(root), tuple(checksums)), **arrays)


def _read_split(root: Path, split: str, classes: list[str], shape, checksums: list):
    """(images (N, D) uint8 in channel planes, labels (N,) uint8, image shape) of root/split, appending
    (relative file, md5) to `checksums`; every image must have `shape` (when given) or the first's."""
    files = _image_files(root / split, classes)
    images = []
    for file, _ in files:
        image, digest = _read(file, shape)
        shape = shape or image.shape
        images.append(image)
        checksums.append((str(file.relative_to(root)), digest))
    stacked = np.stack(images)
    if stacked.ndim == 4:  # (N, H, W, C) -> the channel planes in turn, as every dataset keeps them
        stacked = stacked.transpose(0, 3, 1, 2)
    labels = np.array([label for _, label in files], np.uint8)
    return np.ascontiguousarray(stacked.reshape(len(stacked), -1)), labels, shape


def _class_folders(folder: Path) -> list[str]:
    """Sorted names of the class sub-folders; a stray file beside them is refused."""
    names = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            raise UserError(f"{entry}: images go into a class folder, {folder}/<class>/{entry.name}")
        names.append(entry.name)
    if len(names) > 256:
        raise UserError(f"{folder}: {len(names)} class folders; at most 256 classes")
    return names


def _image_files(folder: Path, classes: list[str]) -> list[tuple[Path, int]]:
    """(file, label) of every image under `folder`/<class>/, in class then name order."""
    files = []
    for label, name in enumerate(classes):
        if not (folder / name).is_dir():
            continue  # a class the test split lacks
        found = 0
        for file in sorted((folder / name).iterdir()):
            if file.name.startswith("."):
                continue
            if file.suffix.lower() not in EXTENSIONS or not file.is_file():
                raise UserError(f"{file}: not an image file ({', '.join(EXTENSIONS)}); move it out of {folder / name}")
            files.append((file, label))
            found += 1
        if not found and folder.name == "train":
            raise UserError(f"{folder / name}: no images in this class folder")
    if not files:
        raise UserError(f"{folder}: no images in its class folders")
    return files


def _read(file: Path, shape: tuple[int, ...] | None) -> tuple[np.ndarray, str]:
    """(pixels (H, W) or (H, W, 3) uint8, md5 of the file); the shape must equal `shape` when given."""
    from PIL import Image  # imported here: only this dataset needs Pillow

    data = read_bytes(file)
    try:
        with warnings.catch_warnings():
            # Pillow only warns between its two decompression-bomb limits; an image that size is refused
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
        with image:
            image.load()
            mode, transparent = image.mode, "transparency" in image.info
            frames = getattr(image, "n_frames", 1)  # an animated PNG (or a GIF named .png) loads frame 1 only
            if mode in MODES and not (mode == "P" and transparent):
                pixels = np.asarray(image.convert(MODES[mode]), dtype=np.uint8)
    # A damaged image surfaces as many exception types depending on the format and the damage.
    except Exception as error:
        raise UserError(f"{file}: not a readable image ({type(error).__name__}: {error})") from None
    if frames > 1:
        raise UserError(f"{file}: an animated image of {frames} frames; only still images are read (nothing "
                        f"dropped): save the frame you mean as its own file")
    if mode not in MODES or (mode == "P" and transparent):
        raise UserError(f"{file}: image mode {mode}{' with transparency' if transparent else ''} is not read "
                        f"(only 8-bit grayscale or RGB, nothing dropped); convert it, e.g. image.convert('RGB')")
    if shape is not None and pixels.shape != shape:
        raise UserError(f"{file}: {_describe(pixels.shape)}, but the first image is {_describe(shape)}; every "
                        f"image must have the same size and channels (nothing is resized)")
    return pixels, hashlib.md5(data).hexdigest()


def _describe(shape: tuple[int, ...]) -> str:
    kind = "RGB" if len(shape) == 3 else "grayscale"
    return f"{shape[1]}x{shape[0]} {kind}"
