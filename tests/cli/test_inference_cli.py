"""`mlptrain evaluate`, `predict` and `export` on the tiny real-data runs (conftest.TINY_RUNS), on the CPU.

The commands run in-process through Typer's runner (a subprocess each would cost seconds of imports);
tests/cli/test_cli.py holds the subprocess checks of exit codes and one-line errors."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlptrain.cli import app
from mlptrain.errors import UserError
from mlptrain.inference.model import load_trained
from tests.cli.test_cli import mlptrain, trained_as_configured


def invoke(*args):
    """Run a command in this process; the run locks it took are released, as at the end of its process."""
    from mlptrain.run_dirs.lock import release_run

    try:
        result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)
    finally:
        for arg in args:
            if Path(str(arg)).is_dir():
                release_run(Path(str(arg)))
    if isinstance(result.exception, UserError):
        raise result.exception
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.mark.parametrize("name", ["mlp", "ae"])
def test_evaluate_matches_the_runs_own_metrics(tiny_runs, name, tmp_path):
    run = tmp_path / name  # a copy: eval-test.json lands in the run directory, which other tests share
    shutil.copytree(tiny_runs[name], run)
    out = invoke("evaluate", run)
    report = json.loads((run / "eval-test.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert report["images"] == summary["dataset"]["test"] and report["checkpoint"] == "best"
    if name == "mlp":  # the training loop's own kernels: the same numbers as its last evaluation
        assert report["loss"] == pytest.approx(summary["test_loss"], rel=1e-5)
        assert report["acc"] == pytest.approx(summary["test_acc"], abs=1e-12)
        matrix = np.array(report["confusion_matrix"])
        assert matrix.sum() == report["images"] and np.trace(matrix) / matrix.sum() == pytest.approx(report["acc"])
        assert [row["images"] for row in report["per_class"]] == matrix.sum(axis=1).tolist()
        assert "confusion matrix" in out and "per-class acc" in out
    else:
        assert report["mse"] == pytest.approx(summary["test_mse"], rel=1e-5)
        assert report["mean_image_mse"] == pytest.approx(summary["mean_image_mse"], rel=1e-5)
        weighted = sum(row["mse"] * row["images"] for row in report["per_class"]) / report["images"]
        assert weighted == pytest.approx(report["mse"], rel=1e-6)
    assert [row["name"] for row in report["per_class"]] == report["class_names"]
    with pytest.raises(UserError, match="eval-test.json exists; add --force"):
        invoke("evaluate", run)
    invoke("evaluate", run, "--force")


def test_evaluate_other_splits_and_checkpoints(tiny_runs, tmp_path):
    run = tiny_runs["mlp"]
    summary = json.loads((run / "summary.json").read_text())
    invoke("evaluate", run, "--split", "val", "--checkpoint", "last", "--out", tmp_path / "val.json")
    report = json.loads((tmp_path / "val.json").read_text())
    assert report["images"] == summary["dataset"]["val"] and report["checkpoint"] == "last"
    assert report["acc"] == pytest.approx(summary["val_acc"], abs=1e-12)
    invoke("evaluate", run, "--split", "train", "--out", tmp_path / "train.json", "--batch-size", "4096")
    assert json.loads((tmp_path / "train.json").read_text())["images"] == summary["dataset"]["train"]
    for args, fragment in [(["--split", "dev"], "--split dev: use test, val, train"),
                           (["--data", "svhn"], "--data: data.dataset: 'svhn' is not one of"),
                           (["--data", "cifar10"], "--data cifar10: cifar10 images are (3, 32, 32)")]:
        with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            invoke("evaluate", run, *args, "--out", tmp_path / "x.json")
        assert not (tmp_path / "x.json").exists()


def test_predict_a_classifier_on_an_npz_and_the_autoencoder_on_pngs(tiny_runs, tmp_path):
    from PIL import Image

    mlp = load_trained(tiny_runs["mlp"])
    images = mlp.dataset.test_images[:12]
    np.savez(tmp_path / "digits.npz", images=images.reshape(12, 28, 28))
    invoke("predict", tiny_runs["mlp"], tmp_path / "digits.npz", "--out", tmp_path / "p.npz")
    with np.load(tmp_path / "p.npz") as out:
        np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, rtol=1e-6)
        np.testing.assert_array_equal(out["predicted"], np.argmax(mlp.images(images), axis=1))
        assert list(out["class_names"]) == mlp.class_names and out["inputs"][0] == "digits.npz[0]"
    ae = load_trained(tiny_runs["ae"])
    folder = tmp_path / "pictures"
    folder.mkdir()
    planes = ae.dataset.test_images[:3].reshape(3, 3, 32, 32)
    for i, image in enumerate(planes):
        Image.fromarray(image.transpose(1, 2, 0)).save(folder / f"{i}.png")
    invoke("predict", tiny_runs["ae"], folder, "--out", tmp_path / "r.npz")
    with np.load(tmp_path / "r.npz") as out:
        assert out["reconstructions"].shape == (3, 3, 32, 32)
        np.testing.assert_allclose(out["reconstructions"], ae.images(planes.reshape(3, -1)), rtol=1e-6)
    with pytest.raises(UserError, match="the image is 32x32 pixels; the model reads 28x28"):
        invoke("predict", tiny_runs["mlp"], folder / "0.png", "--out", tmp_path / "q.npz")
    assert not (tmp_path / "q.npz").exists()


def test_export_safetensors_holds_the_checkpoint_and_the_config(tiny_runs, tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file

    from mlptrain.training.checkpoint import load_checkpoint

    invoke("export", tiny_runs["ae"], "--format", "safetensors", "--out", tmp_path / "ae.safetensors")
    tensors = load_file(tmp_path / "ae.safetensors")
    checkpoint = load_checkpoint(tiny_runs["ae"] / "checkpoints" / "best.npz")
    assert sorted(tensors) == sorted(k.removeprefix("params/") for k in checkpoint if k.startswith("params/"))
    for name, value in tensors.items():  # PyTorch's layout: Conv2d's (out, in, k, k)
        held = checkpoint[f"params/{name}"]
        np.testing.assert_array_equal(value, held.transpose(3, 2, 0, 1) if held.ndim == 4 else held, strict=True)
    with safe_open(tmp_path / "ae.safetensors", "numpy") as f:
        meta = f.metadata()
    assert json.loads(meta["config"])["model"]["channels"] == [4, 4] and meta["input_scale"] == repr(1 / 255)
    assert meta["layout"] == "pytorch"


@pytest.mark.parametrize("name", ["mlp", "mlp-bf16", "ae"])
def test_export_onnx_matches_mlptrains_forward(tiny_runs, tmp_path, name):
    import onnxruntime

    out = invoke("export", tiny_runs[name], "--format", "onnx", "--out", tmp_path / "m.onnx")
    printed = float(out.split("max abs difference ")[1].split()[0])
    assert printed <= 1e-5  # fp32 against fp32 (a bf16 run exports its fp32 master weights)
    trained = load_trained(tiny_runs[name], precision="fp32")
    pixels = trained.dataset.test_images[-64:]  # not the images the command checked
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"pixels": pixels.reshape(-1, *trained.image_shape).astype(np.float32)})
    np.testing.assert_allclose(got[0].reshape(64, -1), trained.images(pixels).reshape(64, -1), rtol=0, atol=1e-5)
    if trained.classifies:
        np.testing.assert_allclose(got[1].sum(axis=1), 1.0, rtol=1e-5)  # probabilities


def test_outputs_are_not_replaced_without_force(tiny_runs, tmp_path):
    target = tmp_path / "features.npz"
    target.write_bytes(b"keep me")
    features = tmp_path / "f.npz"
    x, y = np.eye(4, dtype=np.float32), np.arange(4) % 2
    np.savez(features, train_x=x, train_y=y, test_x=x, test_y=y)
    for command in (["extract-features", tiny_runs["mlp"]], ["export", tiny_runs["mlp"], "--format", "safetensors"],
                    ["predict", tiny_runs["mlp"], tmp_path / "images.npz"], ["svm", features],
                    ["evaluate", tiny_runs["mlp"]]):
        with pytest.raises(UserError, match=f"{target} exists; add --force to overwrite it"):
            invoke(*command, "--out", target)
    assert target.read_bytes() == b"keep me"


def test_bare_command_prints_help_and_version(tmp_path):
    bare = mlptrain(cwd=tmp_path)
    assert bare.returncode == 0 and "Usage: mlptrain" in bare.stdout and "evaluate" in bare.stdout
    version = mlptrain("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"mlptrain {__import__('mlptrain').__version__}"


def test_no_output_replaces_an_input_or_a_runs_own_files_even_with_force(tiny_runs, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_runs["mlp"], run)
    images, features = tmp_path / "images.npz", tmp_path / "f.npz"
    np.savez(images, images=np.zeros((2, 28, 28), np.uint8))
    x, y = np.eye(4, dtype=np.float32), np.arange(4) % 2
    np.savez(features, train_x=x, train_y=y, test_x=x, test_y=y)
    kept = {p: p.read_bytes() for p in (images, features, run / "config.yaml", run / "checkpoints" / "best.npz",
                                        run / "summary.json")}
    commands = [(["predict", run, images, "--out", images], "which this command reads"),
                (["svm", features, "--out", features], "which this command reads")]
    for target in ("config.yaml", "checkpoints/best.npz", "checkpoints/last.npz", "summary.json", "metrics.jsonl"):
        for command in (["evaluate", run], ["export", run, "--format", "safetensors"], ["extract-features", run],
                        ["predict", run, images]):
            commands.append(([*command, "--out", run / target],
                             f"one of the records or checkpoints of {run.resolve()}"))
    __import__("os").mkfifo(tmp_path / "pipe")  # as /dev/null would be: replaced by a file on rename
    commands.append((["evaluate", run, "--out", tmp_path / "pipe"],
                     r"not a regular file \(a device, pipe or socket\)"))
    group = tmp_path / "group"  # a --seeds group's folder: its seeds.json
    group.mkdir()
    (group / "seeds.json").write_text("{}")
    commands.append((["svm", features, "--out", group / "seeds.json"], f"records or checkpoints of {group}"))
    for args, fragment in commands:
        with pytest.raises(UserError, match=fragment):
            invoke(*args, "--force")
    assert all(path.read_bytes() == content for path, content in kept.items())
    assert not (tmp_path / "pipe").is_file()


def test_a_checkpoint_giving_non_finite_outputs_is_refused_not_reported(tiny_runs, tmp_path):
    import shutil

    run = tmp_path / "huge"
    shutil.copytree(tiny_runs["mlp"], run)
    best = run / "checkpoints" / "best.npz"
    arrays = dict(np.load(best))
    # finite (the checkpoint's own checks pass), but its products overflow float32
    arrays["params/fc1.weight"] = np.where(arrays["params/fc1.weight"] < 0, -3e38, 3e38).astype(np.float32)
    np.savez(best, **arrays)
    np.savez(tmp_path / "images.npz", images=np.full((3, 28, 28), 255, np.uint8))
    for command in (["evaluate", run], ["predict", run, tmp_path / "images.npz"], ["export", run, "--format", "onnx"]):
        with pytest.raises(UserError, match="the best checkpoint's model gives NaN or infinite outputs"):
            invoke(*command, "--out", tmp_path / "out.file")
        assert not (tmp_path / "out.file").exists()


def test_a_batch_larger_than_the_data_holds_only_the_data(tiny_runs, tmp_path):
    """A run may train with train.eval_batch_size=1e9 (training clamps it); evaluate and predict clamp too."""
    import shutil

    run = tmp_path / "wide"
    shutil.copytree(tiny_runs["mlp"], run)
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(config.replace("eval_batch_size: 1000", "eval_batch_size: 1000000000"))
    assert "eval_batch_size: 1000000000" in (run / "config.yaml").read_text()
    invoke("evaluate", run, "--out", tmp_path / "e.json")
    np.savez(tmp_path / "images.npz", images=np.zeros((2, 28, 28), np.uint8))
    invoke("predict", run, tmp_path / "images.npz", "--batch-size", "2000000000", "--out", tmp_path / "p.npz")
    assert json.loads((tmp_path / "e.json").read_text())["images"] == 10000


def test_evaluate_on_a_dataset_with_fewer_classes_keeps_the_models_outputs(tiny_runs, tmp_path, rng):
    np.savez(tmp_path / "three.npz", x_train=rng.integers(0, 256, (30, 28, 28), dtype=np.uint8),
             y_train=np.arange(30) % 3, x_test=rng.integers(0, 256, (12, 28, 28), dtype=np.uint8),
             y_test=np.arange(12) % 3, class_names=np.array(["ant", "bee", "cow"]))
    invoke("evaluate", tiny_runs["mlp"], "--data", f"dataset=npz,path={tmp_path / 'three.npz'},val_size=5",
           "--out", tmp_path / "e.json")
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["images"] == 12 and len(report["confusion_matrix"]) == 10
    assert report["class_names"][:4] == ["ant", "bee", "cow", "3"]
    assert [row["images"] for row in report["per_class"]][:4] == [4, 4, 4, 0]


def test_evaluate_refuses_an_empty_validation_split(tiny_runs, tmp_path):
    import shutil

    run = tmp_path / "noval"
    shutil.copytree(tiny_runs["mlp"], run)
    (run / "config.yaml").write_text((run / "config.yaml").read_text().replace("val_size: 5000", "val_size: 0"))
    trained_as_configured(run)  # a run that held out no validation images
    with pytest.raises(UserError, match=r"--split val: the run held out no validation images \(data.val_size 0\)"):
        invoke("evaluate", run, "--split", "val", "--out", tmp_path / "e.json")
    assert not (tmp_path / "e.json").exists()


def test_an_autoencoders_own_validation_split_is_read_in_the_models_layout():
    """evaluate --split val of an autoencoder on a dataset with its own validation images (an npz's val):
    those rows reach the model NHWC like the training rows, not in the dataset's planar layout."""
    from types import SimpleNamespace

    from mlptrain.backends.cpu import CpuBackend
    from mlptrain.data import ImageDataset
    from mlptrain.inference.model import TrainedModel

    rng = np.random.default_rng(0)
    pixels = lambda n: rng.integers(0, 256, (n, 2 * 4 * 4), dtype=np.uint8)  # noqa: E731 (C, H, W) = (2, 4, 4)
    labels = lambda n: np.zeros(n, np.uint8)  # noqa: E731
    dataset = ImageDataset("own-val", pixels(6), labels(6), pixels(3), labels(3), (2, 4, 4), 1, 0.0, 1.0,
                           val_images=pixels(5), val_labels=labels(5))
    config = SimpleNamespace(data=SimpleNamespace(val_size=0), seed=0)
    trained = TrainedModel(Path("runs/x"), config, "best", CpuBackend(), dataset,
                           SimpleNamespace(task="reconstruction"), 1.0, 0.0)
    for name, rows in (("val", dataset.val_images), ("train", dataset.train_images)):
        split = trained.split(name)
        nhwc = rows.reshape(-1, 2, 4, 4).transpose(0, 2, 3, 1).reshape(len(rows), -1)
        np.testing.assert_array_equal(np.asarray(split.images)[split.index], nhwc)


def _without_its_data(run, tmp_path, keep_inputs: bool = True):
    """A copy of `run` whose config.yaml points at an empty data folder (a run folder taken to another machine)."""
    import yaml

    copy = tmp_path / f"moved-{run.name}"
    shutil.copytree(run, copy)
    raw = yaml.safe_load((copy / "config.yaml").read_text())
    raw["data"]["root"] = str(tmp_path / "no-data-here")
    if not keep_inputs:  # a run from before runs recorded their inputs
        del raw["resolved"]["dataset"]["inputs"]
    (copy / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return copy


@pytest.mark.parametrize("name", ["mlp", "ae"])
def test_a_run_folder_alone_predicts_and_exports(tiny_runs, tmp_path, name):
    trained = load_trained(tiny_runs[name])
    pixels = trained.dataset.test_images[:5]
    np.savez(tmp_path / "in.npz", images=pixels.reshape(5, *trained.image_shape))
    invoke("predict", tiny_runs[name], tmp_path / "in.npz", "--out", tmp_path / "here.npz")
    moved = _without_its_data(tiny_runs[name], tmp_path)
    invoke("predict", moved, tmp_path / "in.npz", "--out", tmp_path / "there.npz")
    with np.load(tmp_path / "here.npz") as here, np.load(tmp_path / "there.npz") as there:
        for key in here.files:
            if key != "run":
                np.testing.assert_array_equal(here[key], there[key], strict=True)  # bit for bit
    out = invoke("export", moved, "--format", "onnx", "--out", tmp_path / "m.onnx")
    assert "256 random images" in out and float(out.split("max abs difference ")[1].split()[0]) <= 1e-5
    invoke("export", moved, "--format", "safetensors", "--out", tmp_path / "m.safetensors")
    assert not (tmp_path / "no-data-here").exists()  # nothing made where the data would be
    with pytest.raises(UserError, match="no-data-here"):  # evaluate needs the images it evaluates
        invoke("evaluate", moved, "--out", tmp_path / "e.json")


def test_a_run_that_recorded_no_inputs_reads_its_dataset(tiny_runs, tmp_path):
    moved = _without_its_data(tiny_runs["mlp"], tmp_path, keep_inputs=False)
    with pytest.raises(UserError, match="no-data-here"):
        invoke("export", moved, "--format", "safetensors", "--out", tmp_path / "m.safetensors")


def test_evaluate_on_test_data_alone_feeds_the_model_as_it_was_trained(tiny_runs, tmp_path):
    """An .npz of x_test and y_test alone: evaluate reads it with the run's own normalisation (not the file's
    statistics), so MNIST's test images give exactly the run's own test metrics, and from a run folder moved
    away from its data."""
    trained = load_trained(tiny_runs["mlp"])
    np.savez(tmp_path / "test-only.npz", x_test=trained.dataset.test_images.reshape(-1, 28, 28),
             y_test=trained.dataset.test_labels)
    moved = _without_its_data(tiny_runs["mlp"], tmp_path)
    invoke("evaluate", moved, "--data", f"dataset=npz,path={tmp_path / 'test-only.npz'}", "--out", tmp_path / "e.json")
    invoke("evaluate", tiny_runs["mlp"], "--out", tmp_path / "own.json")
    there, here = (json.loads((tmp_path / f).read_text()) for f in ("e.json", "own.json"))
    assert there["images"] == here["images"] == 10000
    assert (there["loss"], there["acc"]) == (here["loss"], here["acc"])  # bit for bit
    with pytest.raises(UserError, match="--split val: .*test-only.npz holds test data alone .*use --split test"):
        invoke("evaluate", moved, "--data", f"dataset=npz,path={tmp_path / 'test-only.npz'}", "--split", "val",
               "--out", tmp_path / "v.json")
