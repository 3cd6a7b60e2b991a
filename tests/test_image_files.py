"""A user's images for `mlptrain predict`: .npz layouts, PNG files and folders, and the refusals."""

import numpy as np
import pytest

from mlptrain.errors import UserError
from mlptrain.image_files import image_rows, read_images

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


def test_npz_png_and_folder_inputs(rng, tmp_path):
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
    grey, _ = read_images(folder / "0.png", MNIST[:1] + (32, 32))  # a colour image read for a grey model
    assert grey.shape == (1, 32 * 32)


@pytest.mark.parametrize("make, fragment", [
    (lambda p: p.mkdir(), "no .png, .jpg, .jpeg files"),
    (lambda p: p.write_bytes(b"not a png"), "not a readable image"),
    (lambda p: __import__("PIL.Image").Image.new("L", (20, 20)).save(p), "is 20x20 pixels; the model reads 28x28"),
    (lambda p: np.savez(p.with_suffix(".npz"), a=np.zeros(1), b=np.zeros(1)), "name the images one of"),
])
def test_bad_files_are_refused_in_one_line(tmp_path, make, fragment):
    path = tmp_path / "input.png"
    make(path)
    if not path.exists():
        path = path.with_suffix(".npz")
    with pytest.raises(UserError, match=fragment):
        read_images(path, MNIST)
