"""The image-folder layout: PNG files written by the test, read back exactly, and one line per problem."""

import numpy as np
import pytest
from PIL import Image

from mlptrain.data import dataset_record, load_dataset
from mlptrain.data.image_folder import load_image_folder
from mlptrain.errors import UserError


def write_tree(root, rng, classes=("cat", "dog"), per_class=(3, 2), mode="RGB", size=(6, 4)):
    """root/train/<class>/i.png and root/test/<class>/i.png; returns {split: [(pixels, label)]} in file order."""
    written = {}
    for split, count in zip(("train", "test"), per_class):
        written[split] = []
        for label, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
                pixels = rng.integers(0, 256, shape, dtype=np.uint8)
                Image.fromarray(pixels, mode).save(root / split / name / f"{i}.png")
                written[split].append((pixels, label))
    return written


def test_rgb_round_trip(tmp_path, rng):
    written = write_tree(tmp_path, rng)
    ds = load_image_folder(tmp_path)
    assert ds.name == "folder" and ds.image_shape == (3, 4, 6) and ds.class_names == ("cat", "dog")
    expected = np.stack([p.transpose(2, 0, 1).reshape(-1) for p, _ in written["train"]])
    np.testing.assert_array_equal(ds.train_images, expected)
    assert ds.train_labels.tolist() == [0, 0, 0, 1, 1, 1] and ds.test_labels.tolist() == [0, 0, 1, 1]
    record = dataset_record(ds, 2)
    assert (record["train"], record["val"], record["test"], record["files"]) == (4, 2, 4, 10)


def test_grayscale_and_registry(tmp_path, rng, monkeypatch):
    written = write_tree(tmp_path / "pics", rng, mode="L", per_class=(2, 1))
    monkeypatch.chdir(tmp_path)
    ds = load_dataset("folder", path="pics")
    assert ds.image_shape == (1, 4, 6)
    np.testing.assert_array_equal(ds.test_images[1], written["test"][1][0].reshape(-1))


def test_test_split_may_lack_a_class(tmp_path, rng):
    write_tree(tmp_path, rng, classes=("a", "b", "c"))
    for file in (tmp_path / "test" / "b").iterdir():
        file.unlink()
    (tmp_path / "test" / "b").rmdir()
    ds = load_image_folder(tmp_path)
    assert ds.num_classes == 3 and ds.test_labels.tolist() == [0, 0, 2, 2]


def _sixteen_bit(root):
    Image.new("I;16", (6, 4)).save(root / "train" / "cat" / "9.png")


def _other_size(root):
    Image.new("RGB", (5, 4)).save(root / "test" / "dog" / "9.png")


def _grayscale_among_rgb(root):
    Image.new("L", (6, 4)).save(root / "train" / "dog" / "9.png")


def _corrupt(root):
    (root / "train" / "dog" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")


def _unknown_test_class(root):
    (root / "test" / "emu").mkdir()


def _empty_class(root):
    (root / "train" / "emu").mkdir()


def _no_test(root):
    for path in sorted((root / "test").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    (root / "test").rmdir()


def _bomb(root):
    """A PNG declaring 12000 x 12000 pixels, between Pillow's two limits: Pillow only warns (two lines on stderr)."""
    from tests.inference.test_image_files import png_declaring

    (root / "train" / "dog" / "0.png").write_bytes(png_declaring(12000, 12000))


def _animated(root):
    """A two-frame PNG: Pillow loads its first frame and says nothing of the second."""
    frames = [Image.new("RGB", (6, 4), colour) for colour in ("red", "blue")]
    frames[0].save(root / "train" / "cat" / "9.png", save_all=True, append_images=frames[1:])


BAD = {
    "animated": (_animated, "train/cat/9.png", "an animated image of 2 frames; only still images are read"),
    "decompression-bomb": (_bomb, "train/dog/0.png", "not a readable image (DecompressionBombWarning: Image size"),
    "sixteen-bit": (_sixteen_bit, "train/cat/9.png", "image mode I;16 is not read"),
    "other-size": (_other_size, "test/dog/9.png", "5x4 RGB, but the first image is 6x4 RGB"),
    "grayscale-among-rgb": (_grayscale_among_rgb, "train/dog/9.png", "6x4 grayscale, but the first image is 6x4 RGB"),
    "corrupt": (_corrupt, "train/dog/0.png", "not a readable image"),
    "unknown-test-class": (_unknown_test_class, "test/emu", "class 'emu' has no folder in"),
    "empty-class": (_empty_class, "train/emu", "no images in this class folder"),
    "no-test": (_no_test, "", "no test/ folder; data.dataset folder reads DIR/train/<class>/*.png"),
}


@pytest.mark.parametrize("case", BAD, ids=str)
def test_bad_folder(tmp_path, rng, case, recwarn):
    damage, where, fragment = BAD[case]
    write_tree(tmp_path, rng)
    damage(tmp_path)
    with pytest.raises(UserError) as caught:
        load_image_folder(tmp_path)
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / where).rstrip("/") in message and fragment in message, message
    assert not [w for w in recwarn if "DecompressionBomb" in str(w.category)]  # no warning lines besides


def test_missing_folder(tmp_path):
    with pytest.raises(UserError, match="no train/ folder"):
        load_image_folder(tmp_path / "absent")


def test_stray_files_are_skipped_and_transparency_dropped_in_one_line(tmp_path, rng):
    written = write_tree(tmp_path, rng)
    (tmp_path / "train" / "notes.txt").write_text("x")  # beside the class folders
    (tmp_path / "test" / "cat" / "labels.csv").write_text("x")  # among the images
    rgba = rng.integers(0, 256, (4, 6, 4), dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "train" / "dog" / "9.png")
    palette = Image.fromarray(rng.integers(0, 4, (4, 6), dtype=np.uint8), "P")
    palette.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255] * 64)
    palette.save(tmp_path / "test" / "dog" / "9.png", transparency=0)
    ds = load_image_folder(tmp_path)
    assert ds.image_shape == (3, 4, 6) and len(ds.train_images) == 7 and len(ds.test_images) == 5
    np.testing.assert_array_equal(ds.train_images[-1], rgba[:, :, :3].transpose(2, 0, 1).reshape(-1))
    note = ds.provenance.read_note
    assert note == (f"skipped 2 files that are not an image (.png, .jpg, .jpeg, .bmp), e.g. {tmp_path / 'train' / 'notes.txt'}; "
                    f"read 2 images with transparency without it (as RGB or grey, the alpha dropped), e.g. "
                    f"{tmp_path / 'train' / 'dog' / '9.png'}")
    assert "\n" not in note and dataset_record(ds, 2)["files"] == 12  # the skipped files are no part of the data
    assert written  # the plain images are read as before (test_rgb_round_trip)


def test_grey_with_alpha_is_read_as_grey(tmp_path, rng):
    write_tree(tmp_path, rng, mode="L")
    Image.fromarray(rng.integers(0, 256, (4, 6, 2), dtype=np.uint8), "LA").save(tmp_path / "train" / "cat" / "9.png")
    ds = load_image_folder(tmp_path)
    assert ds.image_shape == (1, 4, 6) and "read 1 image with transparency" in ds.provenance.read_note


def test_image_size_resizes_every_image_with_the_bilinear_filter(tmp_path, rng):
    write_tree(tmp_path, rng, size=(6, 4))
    big = rng.integers(0, 256, (9, 12, 3), dtype=np.uint8)
    Image.fromarray(big).save(tmp_path / "train" / "dog" / "9.png")  # 12x9: refused without data.image_size
    with pytest.raises(UserError, match="set data.image_size: \\[height, width\\] to resize them all"):
        load_image_folder(tmp_path)
    ds = load_image_folder(tmp_path, image_size=(8, 10))
    assert ds.image_shape == (3, 8, 10) and len(ds.train_images) == 7
    expected = np.asarray(Image.fromarray(big).resize((10, 8), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(ds.train_images[-1], expected.transpose(2, 0, 1).reshape(-1))


def test_image_size_is_only_for_folders():
    from mlptrain.config.load import config_from_dict

    with pytest.raises(UserError, match="data.image_size resizes the images of data.dataset folder; mnist"):
        config_from_dict({"data": {"dataset": "mnist", "image_size": [28, 28]}})
    with pytest.raises(UserError, match=r"data.image_size: must be \[height, width\]"):
        config_from_dict({"data": {"dataset": "folder", "path": "x", "image_size": [0, 28]}})
    assert config_from_dict({"data": {"dataset": "folder", "path": "x", "image_size": [32, 24]}}).data.image_size == (32, 24)
