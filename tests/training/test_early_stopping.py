"""train.early_stopping: where the run stops, which parameters it ends with, what summary.json says, and
what --resume makes of a run that stopped early (the counter itself across a resume: tests/test_resume.py)."""

import json

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.errors import UserError
from mlptrain.training.checkpoint import load_checkpoint
from mlptrain.training.loop import train
from mlptrain.training.resume import prepare_resume
from mlptrain.training.session import build_session
from tests.training.test_accumulation import make_config, synthetic_dataset
from tests.training.test_resume import new_run

# val_acc gains more than 0.025 last in epoch 4 (0.41, 0.78, 0.91, 0.96, 0.97, 0.98, ...): with patience 2
# the run stops after epoch 6 of 8
ADAM = {"name": "adam", "lr": 0.01}


def stopping(eval_test="every_epoch", **options):
    return make_config(64, 4, ADAM, None, epochs=8, eval_test=eval_test,
                       early_stopping={"metric": "val_acc", "patience": 2, "min_delta": 0.025, **options})


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_run_stops_and_ends_with_the_best_epoch(tmp_path):
    config = stopping()
    run = new_run(tmp_path, "run", config)
    summary = train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert (summary["epochs"], summary["best_epoch"], summary["stopped_early"]) == (6, 4, True)
    assert summary["restored_best"] and summary["epoch"] == 4
    logged = records(run)
    assert [r["epoch"] for r in logged] == [1, 2, 3, 4, 5, 6]  # no evaluation after the stop
    best = logged[3]
    for key in ("val_loss", "val_acc", "test_loss", "test_acc"):  # the restored parameters, evaluated again
        assert summary[key] == pytest.approx(best[key], rel=1e-5), key
    assert int(load_checkpoint(run / "checkpoints" / "best.npz")["meta/epoch"]) == 4
    assert int(load_checkpoint(run / "checkpoints" / "last.npz")["meta/epoch"]) == 6  # written at the stop


def test_without_restore_best_the_last_epoch_is_reported(tmp_path):
    config = stopping(restore_best=False)
    run = new_run(tmp_path, "run", config)
    summary = train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert summary["stopped_early"] and not summary["restored_best"] and summary["epoch"] == 6
    assert summary["test_acc"] == records(run)[-1]["test_acc"]


@pytest.mark.parametrize("restore_best", [True, False])
def test_a_run_that_stops_early_tests_the_parameters_it_ends_with_once(tmp_path, restore_best):
    # train.eval_test end (the default): no epoch's record has test metrics, since none of them is the
    # scheduled last; the summary's are those of the parameters the run ends with, the same numbers as
    # the every-epoch run evaluated for that epoch
    every = train(build_session(stopping(restore_best=restore_best), CpuBackend(), synthetic_dataset()),
                  new_run(tmp_path, "every", stopping(restore_best=restore_best)))
    config = stopping("end", restore_best=restore_best)
    run = new_run(tmp_path, "end", config)
    summary = train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert [r["epoch"] for r in records(run)] == [1, 2, 3, 4, 5, 6]
    assert not any(key.startswith("test_") for r in records(run) for key in r)
    assert summary["epoch"] == (4 if restore_best else 6)
    for key in ("test_loss", "test_acc", "val_acc"):
        assert summary[key] == every[key], key


def test_a_run_that_stopped_early_has_nothing_to_resume_but_its_summary(tmp_path):
    config, dataset = stopping(), synthetic_dataset()
    run = new_run(tmp_path, "run", config)
    expected = train(build_session(config, CpuBackend(), dataset), run)
    with pytest.raises(UserError, match="stopped early after epoch 6 .*nothing to resume"):
        prepare_resume(run, [])
    norms = np.load(run / "grad_norms.npy")
    (run / "summary.json").unlink()  # killed after its last checkpoint, before the summary
    (run / "grad_norms.npy").unlink()
    config, resume = prepare_resume(run, [])
    assert resume.finished
    summary = train(build_session(config, CpuBackend(), dataset), run, resume=resume)
    assert len(records(run)) == 6  # nothing trained or evaluated again
    for key in ("epochs", "best_epoch", "stopped_early", "restored_best", "test_acc", "val_acc", "optimizer_steps"):
        assert summary[key] == expected[key], key
    np.testing.assert_array_equal(np.load(run / "grad_norms.npy"), norms)  # from the checkpoint's step state


def test_a_run_that_never_stalls_trains_every_epoch(tmp_path):
    config = make_config(64, 4, ADAM, None, epochs=3, early_stopping={"patience": 5})
    run = new_run(tmp_path, "run", config)
    summary = train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert summary["epochs"] == 3 and not summary["stopped_early"] and "best_val_loss" in summary
