"""Your own images in class folders (`data.dataset: folder`, `data.path: DIR`), read with Pillow:

    DIR/train/<class>/*.png   (also .jpg, .jpeg, .bmp)
    DIR/test/<class>/*.png

the ImageFolder layout. Classes are the train/ sub-folders in sorted order; test/ may
lack some, not add any. Every image must have the channels of the first (grayscale: 1
channel, RGB: 3), and its size unless `data.image_size` gives one: then each is resized to
it with Pillow's bilinear filter (antialiased when shrinking, as torchvision's Resize). A file that is not an image (a
`notes.txt` beside the images or the class folders) is skipped, and an image with
transparency (RGBA, grey + alpha, a palette with a transparent colour) is read without
it, as RGB or grey: both are said in one warning line, which the run records among its
fallbacks. Every problem is one `UserError` line naming the file or folder.
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
# Pillow mode -> the lossless mode it is read as; others (16-bit, CMYK, ...) are refused.
MODES = {"L": "L", "1": "L", "RGB": "RGB", "P": "RGB"}
# an image with transparency -> what it is read as, the transparency dropped (said in the run's note)
WITHOUT_ALPHA = {"RGBA": "RGB", "LA": "L", "PA": "RGB", "P": "RGB"}
LAYOUT = "DIR/train/<class>/*.png and DIR/test/<class>/*.png"


def load_image_folder(path: str | Path, image_size: tuple[int, int] | None = None) -> ImageDataset:
    """The dataset in the folder at `path`, its images resized to `image_size` (height, width) when given
    (see the module docstring)."""
    root = expand_user(str(path), "data.path").resolve()
    for split in ("train", "test"):
        if not (root / split).is_dir():
            raise UserError(f"data.path {root}: no {split}/ folder; data.dataset folder reads {LAYOUT}")
    skipped, converted = [], []
    classes = _class_folders(root / "train", skipped)
    if not classes:
        raise UserError(f"{root / 'train'}: no class folders; data.dataset folder reads {LAYOUT}")
    for name in _class_folders(root / "test", skipped):
        if name not in classes:
            raise UserError(f"{root / 'test' / name}: class '{name}' has no folder in {root / 'train'}; "
                            f"the classes are the train/ folders ({', '.join(classes)})")
    checksums, arrays, shape = [], {}, None
    for split in ("train", "test"):
        images, labels, shape = _read_split(root, split, classes, shape, checksums, skipped, converted, image_size)
        arrays[f"{split}_images"], arrays[f"{split}_labels"] = images, labels
    channels = shape[2] if len(shape) == 3 else 1
    mean, std = value_statistics(arrays["train_images"], PIXEL_SCALE, f"{root / 'train'}")
    return ImageDataset(name="folder", image_shape=(channels, shape[0], shape[1]), num_classes=len(classes),
                        mean=mean, std=std, class_names=tuple(classes),
                        provenance=Provenance(str(root), tuple(checksums), read_note=_note(skipped, converted)),
                        **arrays)


def _note(skipped: list[Path], converted: list[Path]) -> str | None:
    """The one line saying what reading the folder skipped and converted; None when nothing."""
    parts = []
    if skipped:
        parts.append(f"skipped {len(skipped)} file{'s' if len(skipped) > 1 else ''} that {'are' if len(skipped) > 1 else 'is'} "
                     f"not an image ({', '.join(EXTENSIONS)}), e.g. {skipped[0]}")
    if converted:
        parts.append(f"read {len(converted)} image{'s' if len(converted) > 1 else ''} with transparency without it "
                     f"(as RGB or grey, the alpha dropped), e.g. {converted[0]}")
    return "; ".join(parts) or None


def _read_split(root: Path, split: str, classes: list[str], shape, checksums: list, skipped: list,
                converted: list, image_size: tuple[int, int] | None = None):
    """(images (N, D) uint8 in channel planes, labels (N,) uint8, image shape) of root/split, appending
    (relative file, md5) to `checksums`, files that are not images to `skipped` and images read without
    their transparency to `converted`; every image must have `shape` (when given) or the first's."""
    files = _image_files(root / split, classes, skipped)
    images = []
    for file, _ in files:
        image, digest, dropped = _read(file, shape, image_size)
        if dropped:
            converted.append(file)
        shape = shape or image.shape
        images.append(image)
        checksums.append((str(file.relative_to(root)), digest))
    stacked = np.stack(images)
    if stacked.ndim == 4:  # (N, H, W, C) -> the channel planes in turn, as every dataset keeps them
        stacked = stacked.transpose(0, 3, 1, 2)
    labels = np.array([label for _, label in files], np.uint8)
    return np.ascontiguousarray(stacked.reshape(len(stacked), -1)), labels, shape


def _class_folders(folder: Path, skipped: list) -> list[str]:
    """Sorted names of the class sub-folders; a stray file beside them is added to `skipped`."""
    names = []
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            skipped.append(entry)
            continue
        names.append(entry.name)
    if len(names) > 256:
        raise UserError(f"{folder}: {len(names)} class folders; at most 256 classes")
    return names


def _image_files(folder: Path, classes: list[str], skipped: list) -> list[tuple[Path, int]]:
    """(file, label) of every image under `folder`/<class>/, in class then name order; other files are
    added to `skipped`."""
    files = []
    for label, name in enumerate(classes):
        if not (folder / name).is_dir():
            continue  # a class the test split lacks
        found = 0
        for file in sorted((folder / name).iterdir()):
            if file.name.startswith("."):
                continue
            if file.suffix.lower() not in EXTENSIONS or not file.is_file():
                skipped.append(file)
                continue
            files.append((file, label))
            found += 1
        if not found and folder.name == "train":
            raise UserError(f"{folder / name}: no images in this class folder")
    if not files:
        raise UserError(f"{folder}: no images in its class folders")
    return files


def _read(file: Path, shape: tuple[int, ...] | None, image_size: tuple[int, int] | None = None
          ) -> tuple[np.ndarray, str, bool]:
    """(pixels (H, W) or (H, W, 3) uint8, md5 of the file, whether a transparency was dropped), resized to
    `image_size` (height, width) when given; the shape must equal `shape` when given."""
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
            dropped = mode in WITHOUT_ALPHA and (mode != "P" or transparent)
            if dropped or mode in MODES:
                read = image.convert(WITHOUT_ALPHA[mode] if dropped else MODES[mode])
                if image_size is not None and read.size != (image_size[1], image_size[0]):
                    read = read.resize((image_size[1], image_size[0]), Image.Resampling.BILINEAR)
                pixels = np.asarray(read, dtype=np.uint8)
    # A damaged image surfaces as many exception types depending on the format and the damage.
    except Exception as error:
        raise UserError(f"{file}: not a readable image ({type(error).__name__}: {error})") from None
    if frames > 1:
        raise UserError(f"{file}: an animated image of {frames} frames; only still images are read (nothing "
                        f"dropped): save the frame you mean as its own file")
    if not dropped and mode not in MODES:
        raise UserError(f"{file}: image mode {mode} is not read (only 8-bit grayscale or RGB, with or without "
                        f"transparency); convert it, e.g. image.convert('RGB')")
    if shape is not None and pixels.shape != shape:
        hint = "; set data.image_size: [height, width] to resize them all" if pixels.shape[:2] != shape[:2] else ""
        raise UserError(f"{file}: {_describe(pixels.shape)}, but the first image is {_describe(shape)}; every "
                        f"image must have the same channels, and the same size unless data.image_size is set{hint}")
    return pixels, hashlib.md5(data).hexdigest(), dropped


def _describe(shape: tuple[int, ...]) -> str:
    kind = "RGB" if len(shape) == 3 else "grayscale"
    return f"{shape[1]}x{shape[0]} {kind}"
