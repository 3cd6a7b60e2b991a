"""Images a user hands to `mlptrain predict`: an .npz of arrays, or PNG / JPEG files (one, or a folder of
them, read with Pillow). Each becomes rows in the dataset's layout: (C, H, W) planes flattened, uint8
pixels 0..255, as the dataset that trained the model stores them."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from mlptrain.errors import UserError
from mlptrain.training.fallbacks import warn
from mlptrain.util.npz_archive import open_npz

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
NPZ_KEYS = ("images", "x", "test_x")  # the array read from an .npz holding several
# Pillow modes of 8 bits per channel, converted to grey or RGB as the model reads; 16-bit and float modes
# (I;16, I, F) would be clipped to 0..255 by that conversion, so they are refused
EIGHT_BIT_MODES = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB", "HSV")
ALPHA_MODES = ("LA", "PA", "RGBA")  # their conversion drops the alpha (said in one line, as training says it)


def read_images(path: Path, image_shape: tuple[int, ...], dtype=np.uint8, resize: bool = False
                ) -> tuple[np.ndarray, list[str]]:
    """(rows (N, prod(image_shape)) of `dtype`, a name per row: the file's, or `path[i]` for an .npz). Files of
    a folder that are not images are skipped, and transparency is dropped, each said in one warning line (as
    training on an image folder does, mlptrain.data.image_folder). With `resize` (a run that trained on a
    folder with data.image_size) image files of another size are resized to the model's, as training did."""
    dropped = []
    if path.is_dir():
        rows, names = _read_folder(path, image_shape, dropped, resize)
    elif not path.is_file():
        raise UserError(f"{path}: no such file or folder")
    elif path.suffix.lower() in IMAGE_SUFFIXES:
        rows, names = read_image_file(path, image_shape, dropped, resize)[None], [path.name]
    elif path.suffix.lower() == ".npz":
        rows = image_rows(read_npz(path), image_shape, dtype, path)
        return rows, [f"{path.name}[{i}]" for i in range(len(rows))]
    else:
        raise UserError(f"{path}: give an .npz of images, a {'/'.join(IMAGE_SUFFIXES)} file or a folder of them")
    if dropped:
        warn(f"read {len(dropped)} image{'s' if len(dropped) > 1 else ''} with transparency without it (the alpha "
             f"dropped), e.g. {dropped[0].name}")
    return rows, names


def _read_folder(path: Path, image_shape: tuple[int, ...], dropped: list, resize: bool
                 ) -> tuple[np.ndarray, list[str]]:
    """The images of a folder, in name order; what is not an image is skipped, in one warning line."""
    entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    files = [p for p in entries if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()]
    if not files:
        raise UserError(f"{path}: no {', '.join(IMAGE_SUFFIXES)} files in this folder")
    skipped = [p for p in entries if p not in files]
    if skipped:
        warn(f"skipped {len(skipped)} file{'s' if len(skipped) > 1 else ''} of {path} that "
             f"{'are' if len(skipped) > 1 else 'is'} not an image ({', '.join(IMAGE_SUFFIXES)}), e.g. {skipped[0].name}")
    return np.stack([read_image_file(p, image_shape, dropped, resize) for p in files]), [p.name for p in files]


def read_image_file(path: Path, image_shape: tuple[int, ...], dropped: list | None = None,
                    resize: bool = False) -> np.ndarray:
    """One image as a uint8 row: grey or RGB as the model's channels ask, its size checked (or, with `resize`,
    resized as an image folder's are: Pillow's bilinear filter); `path` is added to `dropped` when it had a
    transparency, which the conversion drops."""
    # Pillow only when image files are read
    from PIL import Image

    if len(image_shape) != 3 or image_shape[0] not in (1, 3):
        raise UserError(f"{path}: the model reads {image_shape} values, not images; give an .npz")
    channels, height, width = image_shape
    try:
        with warnings.catch_warnings():
            # a huge declared size is refused below from the header alone, before anything is decoded
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                if image.size != (width, height) and not resize:
                    raise UserError(f"{path}: the image is {image.size[0]}x{image.size[1]} pixels; the model "
                                    f"reads {width}x{height} (resize it first)")
                if getattr(image, "n_frames", 1) > 1:  # an animated PNG: convert() would take frame 1 only
                    raise UserError(f"{path}: an animated image of {image.n_frames} frames; give each frame "
                                    "as its own still image")
                if image.mode not in EIGHT_BIT_MODES:
                    raise UserError(f"{path}: image mode {image.mode} is not 8 bits per channel (converting it "
                                    "would clip its values); save it as 8-bit grey or RGB")
                if dropped is not None and (image.mode in ALPHA_MODES or "transparency" in image.info):
                    dropped.append(path)
                read = image.convert("L" if channels == 1 else "RGB")
                if read.size != (width, height):  # with `resize` only (checked above)
                    read = read.resize((width, height), Image.Resampling.BILINEAR)
                pixels = np.asarray(read, np.uint8)
    except UserError:
        raise
    # A damaged image surfaces as many exception types (OSError, SyntaxError, struct.error, Pillow's
    # DecompressionBombError, ...) depending on the format and the damage.
    except Exception as err:
        raise UserError(f"{path}: not a readable image ({type(err).__name__}: {err})") from None
    return pixels.reshape(height, width, channels).transpose(2, 0, 1).reshape(-1)


def read_npz(path: Path) -> np.ndarray:
    with open_npz(path, "image file", "save images with np.savez(path, images=...)") as npz:
        key = next((k for k in NPZ_KEYS if k in npz.files), npz.files[0] if len(npz.files) == 1 else None)
        if key is None:
            raise UserError(f"{path}: holds {', '.join(npz.files) or 'no arrays'}; name the images one of "
                            f"{', '.join(NPZ_KEYS)}")
        return npz[key]


def image_rows(array: np.ndarray, image_shape: tuple[int, ...], dtype, path: Path) -> np.ndarray:
    """Rows of `dtype` from (N, D), (N, *image_shape) or, for images, channels-last (N, H, W, C) / (N, H, W)."""
    shape, n = tuple(image_shape), len(array) if array.ndim else 0
    size = int(np.prod(shape))
    accepted = [(size,), shape]
    if len(shape) == 3:
        c, h, w = shape
        accepted += [(h, w, c)] + ([(h, w)] if c == 1 else [])
    if array.ndim < 2 or tuple(array.shape[1:]) not in accepted:
        raise UserError(f"{path}: images of shape {array.shape}; the model reads (N, "
                        f"{', '.join(map(str, shape))}) or (N, {size}) arrays")
    if n == 0:
        raise UserError(f"{path}: holds no images (shape {array.shape}); give at least one")
    if len(shape) == 3 and tuple(array.shape[1:]) not in accepted[:2]:
        array = array.reshape(n, shape[1], shape[2], shape[0]).transpose(0, 3, 1, 2)
    rows = array.reshape(n, size)
    check_values(rows, np.dtype(dtype), path)
    return np.ascontiguousarray(rows.astype(dtype))


def check_values(rows: np.ndarray, dtype: np.dtype, path: Path) -> None:
    """Pixels (dtype uint8) must be whole numbers 0..255; features (float32) finite in float32."""
    pixels = dtype == np.uint8
    if not (np.issubdtype(rows.dtype, np.number) and not np.iscomplexobj(rows)):
        raise UserError(f"{path}: {'images' if pixels else 'features'} of {rows.dtype}; give "
                        f"{'pixel values 0..255' if pixels else 'real numbers'}")
    if not pixels:
        with np.errstate(over="ignore"):
            finite = np.isfinite(rows.astype(dtype))
        if not finite.all():
            row, column = np.argwhere(~finite)[0]
            raise UserError(f"{path}: sample {row}, feature {column} is {rows[row, column]}; features must be finite "
                            "numbers within float32's range (|x| < 3.4e38)")
    elif rows.size and (not np.isfinite(rows).all() or rows.min() < 0 or rows.max() > 255
                        or not np.array_equal(rows, np.round(rows))):
        raise UserError(f"{path}: pixel values must be whole numbers 0..255 (uint8), got {rows.dtype} "
                        f"from {rows.min()} to {rows.max()}; scale images in [0, 1] by 255")
