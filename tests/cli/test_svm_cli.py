"""`mlptrain svm` refuses bad features files and flags with one line, exit code 2, and writes nothing."""

import numpy as np
import pytest

from tests.cli.test_cli import assert_clean_failure, mlptrain


def arrays(rng, n=40, m=12, d=5):
    return {"train_x": rng.normal(size=(n, d)).astype(np.float32), "train_y": np.arange(n) % 3,
            "test_x": rng.normal(size=(m, d)).astype(np.float32), "test_y": np.arange(m) % 3}


def spoilt(rng, kind):
    a = arrays(rng)
    if kind == "missing":
        del a["test_y"]
    elif kind == "rows":
        a["train_y"] = a["train_y"][:-1]
    elif kind == "dims":
        a["test_x"] = a["test_x"][:, :4]
    elif kind == "nan":
        a["train_x"][3, 2] = np.nan
    elif kind == "float-labels":
        a["test_y"] = a["test_y"].astype(np.float32)
    elif kind == "flat":
        a["train_x"] = a["train_x"].reshape(-1)
    elif kind == "one-class":
        a["train_y"] = np.zeros_like(a["train_y"])
    return a


@pytest.mark.parametrize("kind, fragment", [
    ("missing", "features.npz: no test_y array"),
    ("rows", "train_x has 40 rows but train_y 39 labels"),
    ("dims", "train_x has 5 features per image, test_x 4"),
    ("nan", "train_x holds NaN or infinite values"),
    ("float-labels", "test_y must be a 1-D array of integer labels"),
    ("flat", "train_x must be a non-empty 2-D array"),
    ("one-class", "train_y holds a single class"),
])
def test_a_bad_features_file_is_refused(rng, tmp_path, kind, fragment):
    np.savez(tmp_path / "features.npz", **spoilt(rng, kind))
    assert_clean_failure(mlptrain("svm", "features.npz", cwd=tmp_path), fragment)
    assert [p.name for p in tmp_path.iterdir()] == ["features.npz"]


@pytest.mark.parametrize("name, content, fragment", [
    ("features.npz", None, "features.npz: no such features file"),
    ("features.npz", b"train_x,train_y\n", "not an .npz archive"),
    ("features.npz", b"PK\x03\x04 truncated", "not a readable features file"),
    ("features.npy", "npy", "a single .npy array, not an .npz archive"),
])
def test_a_file_that_is_not_a_features_npz_is_refused(tmp_path, name, content, fragment):
    if content == "npy":
        np.save(tmp_path / name, np.zeros(3))
    elif content is not None:
        (tmp_path / name).write_bytes(content)
    assert_clean_failure(mlptrain("svm", name, cwd=tmp_path), fragment)
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.parametrize("args, fragment", [
    (["--C", "abc"], "--C abc: 'abc' is not a number"),
    (["--C", "0"], "--C 0: 0 is outside [1e-09, 1e+09]"),
    (["--C", "0.1,-1"], "-1 is outside [1e-09, 1e+09]"),
    (["--C", "nan"], "nan is outside [1e-09, 1e+09]"),
    (["--max-iter", "0"], "--max-iter 0: must be in [1,"),
    (["--max-iter", "1.5"], "--max-iter 1.5: not an integer"),
    (["--out", "nowhere/svm.json"], "no such directory nowhere"),
    (["--out", "."], "is a directory"),
])
def test_bad_flags_are_refused(rng, tmp_path, args, fragment):
    np.savez(tmp_path / "features.npz", **arrays(rng))
    assert_clean_failure(mlptrain("svm", "features.npz", *args, cwd=tmp_path), fragment)
    assert [p.name for p in tmp_path.iterdir()] == ["features.npz"]


def test_c_selection_needs_every_class_in_the_held_out_part(rng, tmp_path):
    a = arrays(rng)
    a["train_y"][0] = 7  # a class with one training image cannot be stratified
    np.savez(tmp_path / "features.npz", **a)
    assert_clean_failure(mlptrain("svm", "features.npz", "--C", "0.1,1", cwd=tmp_path),
                         "--C with several values holds out 20% of the training features")
    assert [p.name for p in tmp_path.iterdir()] == ["features.npz"]


def test_per_class_table_names_the_classes(rng, tmp_path):
    np.savez(tmp_path / "features.npz", **arrays(rng), class_names=np.array(["ant", "bee", "cow"]))
    result = mlptrain("svm", "features.npz", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(f"{k} {name}" in result.stderr for k, name in enumerate(["ant", "bee", "cow"])), result.stderr


def test_class_names_that_are_not_strings_are_refused(rng, tmp_path):
    np.savez(tmp_path / "features.npz", **arrays(rng), class_names=np.arange(3))
    assert_clean_failure(mlptrain("svm", "features.npz", cwd=tmp_path),
                         "class_names must be a 1-D array of strings, got int64 (3,)")


@pytest.mark.parametrize("change, fragment", [
    ({"class_names": np.array(["ant", "bee"])}, "train_y holds label 2 but class_names names 2 classes (labels 0..1)"),
    ({"train_y": np.arange(40) % 3 - 1}, "train_y holds label -1 but class_names names 3 classes"),
    ({"test_y": np.arange(12) % 3 + 5}, "test_y holds label 7 but class_names names 3 classes (labels 0..2)"),
])
def test_labels_without_a_class_name_are_refused(rng, tmp_path, change, fragment):
    from mlptrain.errors import UserError
    from mlptrain.probe.features import load_features

    np.savez(tmp_path / "features.npz", **{**arrays(rng), "class_names": np.array(["ant", "bee", "cow"]), **change})
    with pytest.raises(UserError) as caught:
        load_features(tmp_path / "features.npz")
    assert fragment in str(caught.value)


def test_svms_of_two_features_files_in_one_folder_each_keep_their_report(rng, tmp_path):
    """The docs' example fits pixels.npz, then pooled.npz, in one folder: the second no longer finds the
    first's report in its way."""
    for name in ("pixels", "pooled"):
        np.savez(tmp_path / f"{name}.npz", **arrays(rng))
        result = mlptrain("svm", f"{name}.npz", "--C", "0.001,0.01", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["pixels.svm.json", "pooled.svm.json"]


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_long_fit_says_what_it_fits_and_ctrl_c_ends_it_at_once(tmp_path, signum):
    """liblinear answers no signal until it returns: the fit runs in a thread, so Ctrl-C (and SIGTERM, and
    SIGHUP) acts within a second, with one line, and a line says first what is being fitted and how big."""
    import signal
    import subprocess
    import sys
    import time

    from tests.cli.test_cli import REPO

    rng = np.random.default_rng(0)  # random labels: liblinear works its way through every iteration
    np.savez(tmp_path / "big.npz", train_x=rng.standard_normal((20000, 256)).astype(np.float32),
             train_y=rng.integers(0, 10, 20000), test_x=rng.standard_normal((100, 256)).astype(np.float32),
             test_y=rng.integers(0, 10, 100))
    proc = subprocess.Popen([sys.executable, "-m", "mlptrain", "svm", "big.npz", "--C", "1", "--max-iter", "100000"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 120
    line = ""
    while "fitting LinearSVC" not in line and time.monotonic() < deadline:
        line = proc.stderr.readline()
    assert "fitting LinearSVC, C 1, on 20,000 x 256 features (standardised), at most 100,000" in line
    time.sleep(1.0)  # into the fit
    sent = time.monotonic()
    proc.send_signal(getattr(signal, signum))
    rest = proc.communicate(timeout=60)[1]
    assert time.monotonic() - sent < 5 and proc.returncode == 128 + getattr(signal, signum), rest
    assert rest.strip().endswith("interrupted"), rest
    assert "Traceback" not in rest and len([x for x in rest.splitlines() if x.strip()]) == 1
    assert not list(tmp_path.glob("*.json"))
