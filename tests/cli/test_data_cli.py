"""Datasets as a user meets them on the command line: an npz of their own trained end to end, what
the run records, the subset warning, the offline message, and refusals before anything is written."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.cli.test_cli import assert_clean_failure, mlptrain
from tests.data.test_cifar import CIFAR10, write_folder

# urllib sends every request through this proxy: a closed local port, so no test reaches the network
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}


def tiny_npz(path, rng):
    np.savez(path, x_train=rng.integers(0, 256, (90, 8, 8), dtype=np.uint8), y_train=np.arange(90) % 3,
             x_test=rng.integers(0, 256, (30, 8, 8), dtype=np.uint8), y_test=np.arange(30) % 3,
             class_names=np.array(["ant", "bee", "cow"]))


def run_args(tmp_path, *overrides):
    return ["run", "adam_mnist", "backend=cpu", "train.epochs=1", "model.hidden=[8]", "train.batch_size=16",
            *overrides, "--runs-dir", str(tmp_path / "runs"), "--name", "r"]


def test_npz_run_records_the_dataset(tmp_path, rng):
    tiny_npz(tmp_path / "tiny.npz", rng)
    result = mlptrain(*run_args(tmp_path, "data.dataset=npz", "data.path=tiny.npz", "data.val_size=10"),
                      cwd=tmp_path, env=NO_NETWORK)
    assert result.returncode == 0, result.stderr
    assert "80 train / 10 val / 30 test" in result.stderr and "warning" not in result.stderr
    run = tmp_path / "runs" / "r"
    summary = json.loads((run / "summary.json").read_text())
    md5 = hashlib.md5((tmp_path / "tiny.npz").read_bytes()).hexdigest()
    assert summary["dataset"] == {
        "name": "npz", "location": str(tmp_path / "tiny.npz"), "shape": [1, 8, 8], "dtype": "uint8", "classes": 3,
        "train": 80, "val": 10, "test": 30, "subset": None, "files": 1,
        "checksum": hashlib.md5(f"{md5}  tiny.npz\n".encode()).hexdigest(), "inputs": summary["dataset"]["inputs"]}
    assert summary["dataset"]["inputs"]["class_names"] == ["ant", "bee", "cow"] and summary["dataset"]["inputs"]["std"] > 0
    written = yaml.safe_load((run / "config.yaml").read_text())
    recorded, summarised = written["resolved"]["dataset"], summary["dataset"]
    assert {**recorded, "inputs": None} == {**summarised, "inputs": None}
    # config.yaml keeps the normalisation exactly (predict reads it back); summary.json rounds its numbers
    assert recorded["inputs"]["mean"] == pytest.approx(summarised["inputs"]["mean"], rel=1e-5)
    # data.path and data.root are recorded absolute: evaluate works from any folder
    assert Path(written["data"]["path"]) == (tmp_path / "tiny.npz").resolve()
    assert Path(written["data"]["root"]).is_absolute()
    assert 0 <= summary["test_acc"] <= 1
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = mlptrain("evaluate", str(run), cwd=elsewhere, env=NO_NETWORK)
    assert result.returncode == 0, result.stderr
    assert list(elsewhere.iterdir()) == []  # nothing made where it was started
    # resuming on other data is refused; on the same data it goes on
    tiny_npz(tmp_path / "tiny.npz", np.random.default_rng(99))
    result = mlptrain("run", "--resume", str(run), "train.epochs=2", cwd=tmp_path, env=NO_NETWORK)
    assert_clean_failure(result, f"--resume {run}: its data changed since the run started")
    # so is evaluating it there (its config.yaml names the data; it is not the data it trained on)
    result = mlptrain("evaluate", str(run), "--split", "val", "--out", "e.json", cwd=tmp_path, env=NO_NETWORK)
    assert_clean_failure(result, f"{run}: its data changed since the run started")
    assert "give the data it trained on, or name other data with --data" in result.stderr
    assert not (tmp_path / "e.json").exists()


def test_cifar10_subset_says_so_once(tmp_path):
    write_folder(CIFAR10, tmp_path / "data" / "cifar10-subset" / CIFAR10.batch_folder, rows=4)
    result = mlptrain(*run_args(tmp_path, "data.dataset=cifar10", "data.val_size=4"), cwd=tmp_path,
                      env={"MLPTRAIN_DATA_DIR": str(tmp_path / "data"), **NO_NETWORK})
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: data: cifar10 is a subset (20 of 50,000 training "
                                                         "and 4 of 10,000 test images, from "), result.stderr
    summary = json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())
    assert summary["dataset"]["subset"] is True and summary["dataset"]["train"] == 16


def test_offline_names_files_and_leaves_no_folder_behind(tmp_path):
    result = mlptrain(*run_args(tmp_path, f"data.root={tmp_path / 'data'}", "data.dataset=kmnist"), cwd=tmp_path,
                      env=NO_NETWORK)
    assert result.returncode == 2 and "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: Kuzushiji-MNIST could not be downloaded (could not download "
                               "train-images-idx3-ubyte.gz: http://codh.rois.ac.jp/kmnist/dataset/kmnist/"), lines
    assert lines[1] == f"put these files into {tmp_path / 'data' / 'kmnist'}:"
    assert lines[2] == "  train-images-idx3-ubyte.gz  from http://codh.rois.ac.jp/kmnist/dataset/kmnist/train-images-idx3-ubyte.gz"
    assert lines[-1] == "or set MLPTRAIN_DATA_DIR (or data.root) to a folder that holds kmnist/" and len(lines) == 7
    assert not (tmp_path / "data").exists()  # no empty dataset folder (nor the data root made for it) left
    assert not (tmp_path / "runs").exists()


def test_bad_npz_and_unfit_model_write_nothing(tmp_path, rng):
    tiny_npz(tmp_path / "tiny.npz", rng)
    with np.load(tmp_path / "tiny.npz") as archive:
        np.savez(tmp_path / "bad.npz", **{k: archive[k] for k in archive.files if k != "y_test"})
    result = mlptrain(*run_args(tmp_path, "data.dataset=npz", "data.path=bad.npz"), cwd=tmp_path)
    assert_clean_failure(result, f"{tmp_path / 'bad.npz'}: missing array y_test")
    result = mlptrain("run", "autoencoder_cifar10", "backend=cpu", "data.dataset=npz", "data.path=tiny.npz",
                      "model.channels=[4,4,4,4]", "data.val_size=10", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_clean_failure(result, "model.channels: 4 conv + max-pool stages need image sides divisible by 16; "
                                 "npz images are 8x8: give model.channels at most 3 widths")
    assert not (tmp_path / "runs").exists()


def test_same_data_passes_the_resume_check(tmp_path, rng):
    from mlptrain.config.load import config_from_dict
    from mlptrain.data import load_dataset
    from mlptrain.training.experiment import check_same_dataset, create_run

    tiny_npz(tmp_path / "tiny.npz", rng)
    config = config_from_dict({"data": {"dataset": "npz", "path": str(tmp_path / "tiny.npz"), "val_size": 10}})
    dataset = load_dataset("npz", path=config.data.path)
    run = create_run(config, tmp_path / "runs", "r", "x", dataset=dataset)
    check_same_dataset(run, config, load_dataset("npz", path=config.data.path))
    (run / "config.yaml").write_text("data: {dataset: npz, path: tiny.npz}\n")  # written before the record
    check_same_dataset(run, config, dataset)


def test_autoencoder_on_images_of_any_channel_count_and_a_classifier_on_one_class(tmp_path, rng):
    """The autoencoder takes C x H x W for any C (its TensorBoard picture shows channels other than 1 and 3
    as grey bands); a classifier whose training labels hold one class is refused before anything is written."""
    np.savez(tmp_path / "c5.npz", x_train=rng.integers(0, 256, (40, 8, 8, 5), dtype=np.uint8),
             y_train=np.zeros(40, int),
             x_test=rng.integers(0, 256, (10, 8, 8, 5), dtype=np.uint8), y_test=np.zeros(10, int))
    result = mlptrain("run", "autoencoder_cifar10", "backend=cpu", "train.epochs=1", "model.channels=[2]",
                      "data.dataset=npz", "data.path=c5.npz", "data.val_size=8", "--runs-dir", str(tmp_path / "runs"),
                      "--name", "ae", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "runs" / "ae" / "summary.json").read_text())["dataset"]["shape"] == [5, 8, 8]
    result = mlptrain(*run_args(tmp_path, "data.dataset=npz", "data.path=c5.npz", "data.val_size=8"), cwd=tmp_path)
    assert_clean_failure(result, f"{tmp_path / 'c5.npz'}: every training label is 0; a classifier (model.type mlp) "
                                 "needs at least two classes")
    assert not (tmp_path / "runs" / "r").exists()


def test_an_npz_with_its_own_validation_split_serves_early_stopping_and_plateau_at_val_size_0(tmp_path, rng):
    """data.val_size holds nothing out of a dataset that has x_val: early stopping and the plateau schedule
    watch that split, so val_size 0 is no reason to refuse them; without x_val it is, once the file is read."""
    tiny_npz(tmp_path / "tiny.npz", rng)
    with np.load(tmp_path / "tiny.npz") as archive:
        arrays = {k: archive[k] for k in archive.files}
    np.savez(tmp_path / "val.npz", **arrays, x_val=arrays["x_test"][:12], y_val=arrays["y_test"][:12])
    watched = ["data.dataset=npz", "data.val_size=0", "train.early_stopping.patience=2", "schedule.name=plateau"]
    result = mlptrain(*run_args(tmp_path, *watched, "data.path=val.npz"), cwd=tmp_path, env=NO_NETWORK)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())["dataset"]["val"] == 12
    for setting in ("train.early_stopping.patience=2", "schedule.name=plateau"):
        args = run_args(tmp_path, "data.dataset=npz", "data.val_size=0", setting, "data.path=tiny.npz")
        refused = mlptrain(*args[:-1], "s", cwd=tmp_path, env=NO_NETWORK)  # the run would be named s
        assert_clean_failure(refused, "the validation metric, and data.val_size is 0")
        assert not (tmp_path / "runs" / "s").exists()


def test_test_data_alone_is_refused_for_training_in_one_line(tmp_path, rng):
    np.savez(tmp_path / "test-only.npz", x_test=rng.integers(0, 256, (20, 8, 8), dtype=np.uint8),
             y_test=rng.integers(0, 3, 20).astype(np.uint8))
    result = mlptrain(*run_args(tmp_path, "data.dataset=npz", "data.path=test-only.npz"), cwd=tmp_path, env=NO_NETWORK)
    assert_clean_failure(result, "holds no training images (x_train, y_train), only test data: evaluate a run on it")
    assert not (tmp_path / "runs").exists()


def test_the_runs_shape_line_says_when_the_batch_is_the_whole_training_set(tmp_path, rng):
    tiny_npz(tmp_path / "tiny.npz", rng)
    result = mlptrain(*run_args(tmp_path, "data.dataset=npz", "data.path=tiny.npz", "data.val_size=10",
                                "train.batch_size=128"), cwd=tmp_path, env=NO_NETWORK)
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stderr.split())
    assert "effective batch 80, the whole training set (batch 128 x 1 accumulated asks 128), 1 optimizer step per " \
           "epoch" in said
