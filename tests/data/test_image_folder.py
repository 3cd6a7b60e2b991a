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


def _rgba(root):
    Image.new("RGBA", (6, 4)).save(root / "train" / "cat" / "9.png")


def _other_size(root):
    Image.new("RGB", (5, 4)).save(root / "test" / "dog" / "9.png")


def _grayscale_among_rgb(root):
    Image.new("L", (6, 4)).save(root / "train" / "dog" / "9.png")


def _corrupt(root):
    (root / "train" / "dog" / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")


def _stray_file(root):
    (root / "train" / "notes.txt").write_text("x")


def _text_in_class(root):
    (root / "test" / "cat" / "labels.csv").write_text("x")


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
    "rgba": (_rgba, "train/cat/9.png", "image mode RGBA is not read"),
    "other-size": (_other_size, "test/dog/9.png", "5x4 RGB, but the first image is 6x4 RGB"),
    "grayscale-among-rgb": (_grayscale_among_rgb, "train/dog/9.png", "6x4 grayscale, but the first image is 6x4 RGB"),
    "corrupt": (_corrupt, "train/dog/0.png", "not a readable image"),
    "stray-file": (_stray_file, "train/notes.txt", "images go into a class folder"),
    "text-in-class": (_text_in_class, "test/cat/labels.csv", "not an image file"),
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
