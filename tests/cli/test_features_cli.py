"""`mlptrain extract-features` refuses bad input with one line, exit code 2, and writes nothing."""

import shutil

import numpy as np
import pytest
import yaml

from tests.cli.test_cli import assert_clean_failure, mlptrain, trained_as_configured


def files_under(*folders):
    """Every file and its modification time, the run lock aside (whoever takes it writes its pid there)."""
    return {path: path.stat().st_mtime_ns for folder in folders for path in folder.rglob("*") if path.name != ".lock"}


def broken_run(tiny_runs, where, kind):
    """A copy of the tiny autoencoder run, spoilt in one way."""
    run = where / kind
    shutil.copytree(tiny_runs["ae"], run)
    if kind == "no-checkpoint":
        shutil.rmtree(run / "checkpoints")
    elif kind == "only-last":
        (run / "checkpoints" / "best.npz").unlink()
    elif kind in ("other-model", "other-recorded-model"):
        config = yaml.safe_load((run / "config.yaml").read_text())
        config["model"]["channels"] = [8, 4]
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        if kind == "other-recorded-model":  # the checkpoint's record agrees, its parameters do not
            trained_as_configured(run)
    elif kind == "corrupt-checkpoint":
        (run / "checkpoints" / "best.npz").write_bytes(b"PK\x03\x04 not really a zip")
    return run


@pytest.mark.parametrize("kind, fragment", [
    ("no-checkpoint", "no checkpoints/best.npz (the run stopped before its first checkpoint)"),
    ("only-last", "no checkpoints/best.npz (use --checkpoint last)"),
    ("other-model", "config.yaml differs from the config the checkpoint was trained with: model.channels ([4, 4] -> "
                    "[8, 4])"),
    ("other-recorded-model", "has shape (3, 3, 3, 4), the model's is (3, 3, 3, 8); was the config.yaml beside it "
                             "changed?"),
    ("corrupt-checkpoint", "not a readable checkpoint"),
])
def test_a_run_without_a_usable_checkpoint_is_refused(tiny_runs, tmp_path, kind, fragment):
    run = broken_run(tiny_runs, tmp_path, kind)
    before = files_under(tmp_path)
    assert_clean_failure(mlptrain("extract-features", str(run), cwd=tmp_path), fragment)
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("run, args, fragment", [
    ("ae", ["--layer", "hidden1"], "--layer hidden1: the run's conv_autoencoder has no such layer; valid: latent, "
                                   "input"),
    ("mlp", ["--layer", "hidden2"], "valid: hidden1, input"),
    ("mlp", ["--layer", "latent"], "valid: hidden1, input"),
    ("ae", ["--checkpoint", "first"], "--checkpoint first: use best or last"),
    ("ae", ["--out", "nowhere/features.npz"], "no such directory nowhere"),
    ("ae", ["--out", "."], "is a directory"),
    ("ae", ["--batch-size", "0"], "--batch-size 0: must be in [1,"),
    ("mlp", ["--batch-size", "many"], "--batch-size many: not an integer"),
    (None, [], "no such run directory"),
])
def test_bad_flags_are_refused(tiny_runs, tmp_path, run, args, fragment):
    run_dir = tiny_runs[run] if run else tmp_path / "missing"
    before = files_under(tmp_path, *tiny_runs.values())
    assert_clean_failure(mlptrain("extract-features", str(run_dir), *args, cwd=tmp_path), fragment)
    assert files_under(tmp_path, *tiny_runs.values()) == before


def test_a_folder_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_clean_failure(mlptrain("extract-features", "empty", cwd=tmp_path), "no config.yaml, so not a run directory")
    assert list((tmp_path / "empty").iterdir()) == []


def test_an_mlp_without_hidden_layers_needs_an_explicit_layer(tiny_runs, tmp_path):
    run = tmp_path / "logistic"
    shutil.copytree(tiny_runs["mlp"], run)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model"]["hidden"] = []
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    trained_as_configured(run)
    assert_clean_failure(mlptrain("extract-features", str(run), cwd=tmp_path), "give --layer input")
    assert not (run / "features.npz").exists()
    np.testing.assert_equal(sorted(p.name for p in run.iterdir()), sorted(p.name for p in tiny_runs["mlp"].iterdir()))
