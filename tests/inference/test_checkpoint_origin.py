"""Which epoch a checkpoint holds, and by what rule `best` was picked: said by `evaluate` (which loads `best`
by default) and by `run` (whose summary reports the last epoch), in the same words."""

import numpy as np

from mlptrain.cli.run import checkpoint_line
from mlptrain.inference.loading import checkpoint_origin, describe_origin
from mlptrain.training.checkpoint import load_checkpoint, save_checkpoint
from tests.run_dirs.test_run_safety import trained_run


def test_a_checkpoint_says_its_epoch_and_why_it_is_the_best(tmp_path):
    run_dir = trained_run(tmp_path, epochs=2)
    best, last = checkpoint_origin(run_dir, "best"), checkpoint_origin(run_dir, "last")
    assert last["epoch"] == 2 and best["selected_by"] == "val_acc" and 1 <= best["epoch"] <= 2
    assert 0.0 <= best["value"] <= 1.0
    assert describe_origin("best", best) == f"best checkpoint: epoch {best['epoch']}, best val_acc {best['value']:.4g}"
    arrays = load_checkpoint(run_dir / "checkpoints" / "last.npz")
    arrays["meta/best_epoch"] = np.array(1, np.int64)  # a last epoch that was not the best: no "best" said of it
    save_checkpoint(run_dir / "checkpoints" / "last.npz", arrays)
    assert describe_origin("last", checkpoint_origin(run_dir, "last")) == "last checkpoint: epoch 2"
    assert checkpoint_origin(tmp_path / "nowhere", "best") == {}


def test_the_runs_line_says_which_epoch_its_metrics_are_and_what_best_holds():
    base = {"selected_by": "val_acc", "best_val_acc": 0.9871, "epoch": 10, "best_epoch": 7, "restored_best": False}
    assert checkpoint_line(base) == ("the metrics are the last epoch's (10, checkpoints/last.npz); "
                                     "checkpoints/best.npz holds epoch 7, the best val_acc (0.9871), which mlptrain "
                                     "evaluate loads unless --checkpoint last")
    assert "also the best val_acc" in checkpoint_line({**base, "best_epoch": 10})
    assert "restored by early stopping" in checkpoint_line({**base, "epoch": 7, "restored_best": True})
    assert checkpoint_line({**base, "best_val_acc": None}) is None  # no validation split: nothing picked a best
