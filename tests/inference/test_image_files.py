"""A user's images for `mlptrain predict`: .npz layouts, PNG files and folders, and the refusals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlptrain.errors import UserError
from mlptrain.inference.image_files import image_rows, read_images

CIFAR, MNIST = (3, 32, 32), (1, 28, 28)


@pytest.mark.parametrize("shape, layout", [(CIFAR, "flat"), (CIFAR, "chw"), (CIFAR, "hwc"), (MNIST, "chw"),
                                           (MNIST, "hw"), (MNIST, "hwc")])
def test_every_layout_becomes_the_datasets_rows(rng, shape, layout, tmp_path):
    planes = rng.integers(0, 256, (4, *shape), dtype=np.uint8)  # the dataset's (C, H, W)
    given = {"flat": planes.reshape(4, -1), "chw": planes, "hwc": planes.transpose(0, 2, 3, 1),
             "hw": planes[:, 0]}[layout]
    rows = image_rows(given.astype(np.int64), shape, np.uint8, tmp_path / "x.npz")
    assert rows.dtype == np.uint8
    np.testing.assert_array_equal(rows, planes.reshape(4, -1))


@pytest.mark.parametrize("array, fragment", [
    (np.full((2, 1, 28, 28), 0.5), "whole numbers 0..255"),
    (np.full((2, 1, 28, 28), 300), "whole numbers 0..255"),
    (np.zeros((2, 27, 27)), "the model reads (N, 1, 28, 28) or (N, 784)"),
    (np.zeros(784), "the model reads"),
    (np.array([["a"] * 784]), "give pixel values 0..255"),
])
def test_bad_arrays_are_refused_in_one_line(array, fragment, tmp_path):
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        image_rows(array, MNIST, np.uint8, tmp_path / "x.npz")


def test_npz_png_and_folder_inputs(rng, tmp_path, capsys):
    from PIL import Image

    images = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    np.savez(tmp_path / "batch.npz", images=images)
    rows, names = read_images(tmp_path / "batch.npz", CIFAR)
    np.testing.assert_array_equal(rows, images.transpose(0, 3, 1, 2).reshape(3, -1))
    assert names == ["batch.npz[0]", "batch.npz[1]", "batch.npz[2]"]
    folder = tmp_path / "pngs"
    folder.mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"{i}.png")
    (folder / "notes.txt").write_text("not an image")
    rows, names = read_images(folder, CIFAR)
    np.testing.assert_array_equal(rows, images.transpose(0, 3, 1, 2).reshape(3, -1))  # PNG is lossless
    assert names == ["0.png", "1.png", "2.png"]
    said = capsys.readouterr().err
    assert said.count("warning:") == 1 and "skipped 1 file" in said and "notes.txt" in said
    Image.fromarray(np.dstack([images[0], images[0][:, :, :1]]), "RGBA").save(folder / "3.png")
    rows, _ = read_images(folder, CIFAR)
    np.testing.assert_array_equal(rows[3], rows[0])  # the alpha dropped, the colours kept
    said = capsys.readouterr().err
    assert "read 1 image with transparency without it" in said and "3.png" in said
    grey, _ = read_images(folder / "0.png", MNIST[:1] + (32, 32))  # a colour image read for a grey model
    assert grey.shape == (1, 32 * 32)


def assert_refused(tmp_path, make, fragment):
    """`make` writes input.png (or, where it writes an .npz, input.npz); reading it for MNIST is refused."""
    path = tmp_path / "input.png"
    make(path)
    if not path.exists():
        path = path.with_suffix(".npz")
    with pytest.raises(UserError, match=fragment):
        read_images(path, MNIST)


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p.mkdir(), "no .png, .jpg, .jpeg files"),
    (lambda p: p.write_bytes(b"not a png"), "not a readable image"),
    (lambda p: __import__("PIL.Image").Image.new("L", (20, 20)).save(p), "is 20x20 pixels; the model reads 28x28"),
    (lambda p: np.savez(p.with_suffix(".npz"), a=np.zeros(1), b=np.zeros(1)), "name the images one of"),
])
def test_bad_files_are_refused_in_one_line(tmp_path, make, fragment):
    assert_refused(tmp_path, make, fragment)


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height grey pixels, followed by a few bytes of data: Pillow's
    decompression-bomb limit refuses it when opened."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + \
        chunk(b"IEND", b"")


@pytest.mark.parametrize("make, fragment", [
    # 16-bit grey: converting it to 8 bits would clip every value above 255
    (lambda p: __import__("PIL.Image").Image.fromarray(np.full((28, 28), 60000, np.uint16)).save(p),
     "image mode I;16 is not 8 bits per channel"),
    (lambda p: __import__("PIL.Image").Image.new("L", (28, 28)).save(
        p, save_all=True, append_images=[__import__("PIL.Image").Image.new("L", (28, 28), 255)]),
     "an animated image of 2 frames"),  # convert() took frame 1 and dropped the other without a word
    (lambda p: p.write_bytes(png_declaring(60000, 60000)), r"not a readable image \(DecompressionBombError"),
    (lambda p: p.write_bytes(png_declaring(12000, 12000)), "the image is 12000x12000 pixels; the model reads 28x28"),
    (lambda p: np.save(p.with_suffix(".npz").open("wb"), np.zeros((2, 784), np.uint8)), "a single .npy array"),
    (lambda p: np.savez(p.with_suffix(".npz"), images=np.zeros((0, 28, 28), np.uint8)),
     r"holds no images \(shape \(0, 28, 28\)\)"),
])
def test_hostile_files_are_refused_in_one_line(tmp_path, make, fragment, recwarn):
    assert_refused(tmp_path, make, fragment)
    assert not [w for w in recwarn if "DecompressionBomb" in str(w.category)]  # no second line on stderr


@settings(max_examples=40, deadline=None)
@given(value=st.sampled_from([np.nan, np.inf, -np.inf, 1e39, -1e300]), row=st.integers(0, 2), column=st.integers(0, 15))
def test_features_a_model_cannot_read_are_refused_naming_the_value(value, row, column):
    """A features model (float32 input of D values) takes finite numbers within float32; anything else was
    fed through and its NaN outputs blamed on the checkpoint."""
    features = np.ones((3, 16))
    features[row, column] = value
    with pytest.raises(UserError, match=f"sample {row}, feature {column} is .*; features must be finite numbers"):
        image_rows(features, (16,), np.float32, "x.npz")
    np.testing.assert_array_equal(image_rows(np.ones((3, 16), np.int64), (16,), np.float32, "x.npz"), 1.0)
    with pytest.raises(UserError, match="features of <U1; give real numbers"):
        image_rows(np.full((3, 16), "a"), (16,), np.float32, "x.npz")


def test_a_run_trained_on_resized_images_resizes_the_images_it_predicts(rng, tmp_path):
    from PIL import Image

    picture = rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)
    Image.fromarray(picture).save(tmp_path / "big.png")
    with pytest.raises(UserError, match="the image is 30x40 pixels; the model reads 32x32"):
        read_images(tmp_path / "big.png", CIFAR)
    rows, _ = read_images(tmp_path / "big.png", CIFAR, resize=True)
    expected = np.asarray(Image.fromarray(picture).resize((32, 32), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(rows[0], expected.transpose(2, 0, 1).reshape(-1))  # as training resized its own
