"""Every command that reads a trained run checks its config.yaml against the config its checkpoint recorded,
as --resume does (issue 36: a seed edited after training made `evaluate --split val` evaluate another
validation split, acc 0.9002 against the run's recorded 0.8956, without a word)."""

import shutil

import numpy as np
import pytest

from mlptrain.errors import UserError
from tests.cli.test_inference_cli import invoke


def edited(run, tmp_path, old: str, new: str):
    copy = tmp_path / "edited"
    shutil.copytree(run, copy)
    text = (copy / "config.yaml").read_text()
    assert old in text
    (copy / "config.yaml").write_text(text.replace(old, new))
    return copy


@pytest.mark.parametrize("old, new, shown", [("seed: 0", "seed: 7", "seed (0 -> 7)"),
                                             ("val_size: 5000", "val_size: 4000", "data.val_size (5000 -> 4000)"),
                                             ("lr: 0.001", "lr: 0.002", "optim.lr (0.001 -> 0.002)")])
def test_a_config_edited_after_training_is_refused_by_every_command(tiny_runs, tmp_path, old, new, shown):
    run = edited(tiny_runs["mlp"], tmp_path, old, new)
    np.savez(tmp_path / "images.npz", images=np.zeros((2, 28, 28), np.uint8))
    for command in (["evaluate", run, "--split", "val"], ["evaluate", run, "--checkpoint", "last"],
                    ["predict", run, tmp_path / "images.npz"], ["export", run, "--format", "safetensors"],
                    ["extract-features", run]):
        with pytest.raises(UserError, match=f"{run}: config.yaml differs from the config the checkpoint was trained "
                                            f"with: {shown.replace('(', '[(]').replace(')', '[)]')}; the run's "
                                            "commands read it as it was trained: restore config.yaml"):
            invoke(*command, "--out", tmp_path / "out.file")
    assert not (tmp_path / "out.file").exists()


def test_what_does_not_change_training_may_differ(tiny_runs, tmp_path):
    """The keys --resume lets differ (where the data lives, evaluation's batch): the run reads as it did."""
    run = edited(tiny_runs["mlp"], tmp_path, "eval_batch_size: 1000", "eval_batch_size: 500")
    report = invoke("evaluate", run, "--split", "val", "--out", tmp_path / "val.json")
    assert "val: 5,000 images" in report
