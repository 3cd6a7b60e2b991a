"""npz user data: images and features round trip, and one clear line for every bad file."""

import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlptrain.data import dataset_record, load_dataset
from mlptrain.data.npz import load_npz
from mlptrain.errors import UserError


def arrays(rng, *, train=20, test=6, shape=(8, 6), classes=3, **extra):
    out = {"x_train": rng.integers(0, 256, (train, *shape), dtype=np.uint8),
           "y_train": rng.integers(0, classes, train), "x_test": rng.integers(0, 256, (test, *shape), dtype=np.uint8),
           "y_test": rng.integers(0, classes, test)}
    out.update(extra)
    return out


def save(tmp_path, contents, name="data.npz", compressed=False):
    path = tmp_path / name
    (np.savez_compressed if compressed else np.savez)(path, **contents)
    return path


def test_grayscale_images(tmp_path, rng):
    a = arrays(rng, class_names=np.array(["cat", "dog", "emu"]))
    a["y_train"][0] = 2  # every class present, whatever the draw
    ds = load_npz(save(tmp_path, a, compressed=True))
    assert ds.name == "npz" and ds.image_shape == (1, 8, 6) and ds.num_classes == 3 and ds.value_scale == 255.0
    assert ds.class_names == ("cat", "dog", "emu") and not ds.has_val_split
    np.testing.assert_array_equal(ds.train_images, a["x_train"].reshape(20, 48))
    np.testing.assert_array_equal(ds.test_labels, a["y_test"])
    assert ds.train_labels.dtype == np.uint8 and ds.train_images.flags.c_contiguous
    assert ds.mean == pytest.approx(a["x_train"].mean() / 255) and ds.std == pytest.approx(a["x_train"].std() / 255)


def test_channels_last_images_become_planes(tmp_path, rng):
    a = arrays(rng, shape=(4, 6, 3))
    ds = load_npz(save(tmp_path, a))
    assert ds.image_shape == (3, 4, 6)
    np.testing.assert_array_equal(ds.train_images.reshape(20, 3, 4, 6), a["x_train"].transpose(0, 3, 1, 2))


def test_int64_pixels_in_range_are_uint8(tmp_path, rng):
    a = arrays(rng)
    a["x_train"] = a["x_train"].astype(np.int64)
    ds = load_npz(save(tmp_path, a))
    assert ds.train_images.dtype == np.uint8


def test_float_features_with_validation_split(tmp_path, rng):
    a = {"x_train": rng.normal(5, 2, (30, 7)), "y_train": rng.integers(0, 4, 30),
         "x_val": rng.normal(5, 2, (5, 7)).astype(np.float32), "y_val": np.arange(5) % 4,
         "x_test": rng.normal(5, 2, (9, 7)), "y_test": rng.integers(0, 4, 9).astype(np.uint8)}
    ds = load_npz(save(tmp_path, a))
    assert ds.image_shape == (7,) and ds.value_scale == 1.0 and ds.train_images.dtype == np.float32
    assert ds.has_val_split and ds.val_images.shape == (5, 7)
    assert ds.num_classes == max(a["y_train"].max(), a["y_val"].max(), a["y_test"].max()) + 1
    assert ds.class_names == tuple(str(i) for i in range(ds.num_classes))
    assert ds.mean == pytest.approx(a["x_train"].mean(), rel=1e-6) and ds.std == pytest.approx(a["x_train"].std(), rel=1e-6)
    record = dataset_record(ds, 5000)  # data.val_size is not used: the file brings its own split
    assert (record["train"], record["val"], record["test"]) == (30, 5, 9) and record["dtype"] == "float32"
    assert record["location"] == str(tmp_path / "data.npz") and record["files"] == 1


def test_registry_reads_data_path(tmp_path, rng, monkeypatch):
    save(tmp_path, arrays(rng))
    monkeypatch.chdir(tmp_path)
    ds = load_dataset("npz", path="data.npz")  # relative to the working directory
    assert ds.provenance.location == str(tmp_path / "data.npz")
    with pytest.raises(UserError, match="data.dataset npz needs data.path"):
        load_dataset("npz")


def _drop(name):
    return lambda a: a.pop(name)


def _set(name, value):
    def change(a):
        a[name] = value(a) if callable(value) else value
    return change


# case -> (change to a valid set of arrays, fragments of the one-line message)
BAD = {
    "missing-array": (_drop("y_test"), ["missing array y_test", "needs x_train, y_train, x_test, y_test",
                                        "this file has x_train, y_train, x_test"]),
    "unknown-array": (_set("X_val", np.zeros(3)), ["unknown array 'X_val'; did you mean 'x_val'?"]),
    "val-without-labels": (_set("x_val", lambda a: a["x_test"]), ["has x_val but no y_val"]),
    "lengths": (_set("y_train", lambda a: a["y_train"][:-1]), ["y_train has 19 labels but x_train 20 samples"]),
    "label-negative": (_set("y_test", np.array([0, 1, -1, 0, 1, 2])), ["y_test holds label -1",
                                                                        "class indices 0..K-1"]),
    "label-beyond-names": (_set("class_names", np.array(["a", "b"])), ["holds label 2 but class_names names 2",
                                                                       "(labels 0..1)"]),
    "label-256": (_set("y_train", lambda a: np.full(20, 256)), ["y_train holds label 256; at most 256 classes"]),
    "labels-float": (_set("y_train", lambda a: a["y_train"].astype(float)), ["y_train has dtype float64",
                                                                            "labels must be integers"]),
    "labels-one-hot": (_set("y_test", lambda a: np.eye(3, dtype=int)[a["y_test"]]), ["y_test has shape (6, 3)",
                                                                                    "y.argmax(1)"]),
    "nan": (_set("x_train", lambda a: np.where(np.arange(20 * 5).reshape(20, 5) == 17, np.nan, 1.0)),
            ["x_train holds nan (sample 3, feature 2)", "must be finite"]),
    "inf-in-float32": (_set("x_test", lambda a: np.full((6, 48), 1e300)), ["x_test holds inf", "after conversion"]),
    "bool": (_set("x_train", lambda a: a["x_train"] > 9), ["x_train has dtype bool", "uint8 images"]),
    "complex": (_set("x_test", lambda a: a["x_test"].astype(complex)), ["x_test has dtype complex128"]),
    "one-dim": (_set("x_train", np.arange(20)), ["x_train has shape (20,)", "(N, H, W) or (N, H, W, C)"]),
    "five-dim": (_set("x_test", np.zeros((6, 1, 8, 6, 1), np.uint8)), ["x_test has shape (6, 1, 8, 6, 1)"]),
    "float-images": (_set("x_train", lambda a: a["x_train"] / 255.0), ["x_train is float64 of shape (20, 8, 6)",
                                                                      "x.reshape(len(x), -1)"]),
    "pixels-out-of-range": (_set("x_train", lambda a: a["x_train"].astype(np.int16) * 2), ["x_train holds values",
                                                                                         "must be in 0..255"]),
    "channels-first": (_set("x_train", np.zeros((20, 3, 8, 8), np.uint8)), ["looks channels-first",
                                                                             "x.transpose(0, 2, 3, 1)"]),
    "shape-mismatch": (_set("x_test", np.zeros((6, 8, 7), np.uint8)), ["x_test samples have shape (8, 7), "
                                                                       "x_train's (8, 6)"]),
    "kind-mismatch": (_set("x_test", np.zeros((6, 48), np.float32)), ["x_test holds float features, x_train uint8 pixels"]),
    "empty": (_set("x_test", np.zeros((0, 8, 6), np.uint8)), ["x_test holds no samples"]),
    "object-array": (None, ["array 'class_names' holds Python objects", "dtype=str"]),
    "names-not-strings": (_set("class_names", np.arange(3)), ["class_names must be a 1-D array of strings",
                                                             "got int64 (3,)"]),
    "constant": (_set("x_train", np.zeros((20, 8, 6), np.uint8)), ["x_train: every training value is 0"]),
}


@pytest.mark.parametrize("case", BAD, ids=str)
def test_bad_npz(tmp_path, rng, case):
    change, fragments = BAD[case]
    a = arrays(rng)
    a["y_train"][:3] = [0, 1, 2]
    if change is not None:
        change(a)
    if case == "nan":
        a.update(x_test=np.ones((6, 5)))
    path = save(tmp_path, a)
    if case == "object-array":  # np.savez pickles an object array; np.load refuses to unpickle it
        with zipfile.ZipFile(path, "a") as archive, archive.open("class_names.npy", "w") as member:
            np.lib.format.write_array(member, np.array(["a", None], dtype=object), allow_pickle=True)
    with pytest.raises(UserError) as caught:
        load_npz(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("content, fragment", [
    (b"", "not an .npz archive (an .npz is a zip file; this one does not start as one)"),
    (b"x_train,y_train\n1,2\n", "not an .npz archive (an .npz is a zip file"),
    (None, "not a readable npz dataset"),  # a truncated zip
], ids=["empty", "text", "truncated"])
def test_not_an_npz(tmp_path, rng, content, fragment):
    path = save(tmp_path, arrays(rng))
    path.write_bytes(path.read_bytes()[:300] if content is None else content)
    with pytest.raises(UserError) as caught:
        load_npz(path)
    message = str(caught.value)
    assert fragment in message and str(path) in message and "np.savez(path, x_train=" in message
    assert "\n" not in message


def test_npy_file_is_not_an_npz(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(3))
    with pytest.raises(UserError, match="a single .npy array, not an .npz archive"):
        load_npz(path)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match=f"data.path {tmp_path / 'none.npz'}: no such file"):
        load_npz(tmp_path / "none.npz")


def test_damaged_member(tmp_path, rng):
    path = save(tmp_path, arrays(rng), compressed=True)
    data = bytearray(path.read_bytes())
    data[200:260] = bytes(60)  # inside the first member's compressed bytes
    path.write_bytes(bytes(data))
    with pytest.raises(UserError) as caught:
        load_npz(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(exponent=st.integers(-45, 38), offset=st.sampled_from([0.0, 1.0, 1e30]))
def test_features_float32_cannot_standardise_are_refused_before_training(tmp_path, exponent, offset):
    """value * (1 / std) - mean / std is the model's input in float32: where that overflows (a spread of
    1e-41, say) the file is refused naming it; every other scale passes."""
    from mlptrain.data.dataset import value_statistics

    spread = np.linspace(0.0, 1.0, 64, dtype=np.float64) * 10.0 ** exponent
    x = (offset + spread).astype(np.float32).reshape(16, 4)
    if np.ptp(x) == 0:
        return  # float32 rounds the spread away: the constant-input refusal's case
    try:
        mean, std = value_statistics(x, 1.0, "f.npz: x_train")
    except UserError as err:
        assert "standardising them overflows float32" in str(err)
        wide = x.astype(np.float64)
        with np.errstate(over="ignore"):  # the overflow is what the refusal is about
            assert not np.isfinite(np.float32(1 / wide.std())) or not np.isfinite(np.float32(wide.mean() / wide.std()))
    else:
        assert np.isfinite(np.float32(1 / std)) and np.isfinite(np.float32(mean / std))


def test_a_data_path_that_is_no_regular_file_is_refused_not_waited_on(tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.npz")  # opening a FIFO for reading waits for a writer: forever
    (tmp_path / "folder.npz").mkdir()
    for name in ("pipe.npz", "folder.npz"):
        with pytest.raises(UserError, match=f"data.path {tmp_path / name}: not a regular file"):
            load_npz(tmp_path / name)
