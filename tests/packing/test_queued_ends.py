"""A packed lane's epoch end queued on the device and finished during the next epoch
(mlptrain.training.queued_end): the same reads, records, checkpoints and bits as the run alone, and the same
outcome as an epoch end done at once on a stop, a diverged read or a diverged evaluation."""

import json
import signal
from types import SimpleNamespace

import numpy as np
import pytest

from mlptrain.errors import TrainingDiverged, TrainingInterrupted
from mlptrain.seeds.runner import run_seeds
from mlptrain.training import loop, queued_end
from mlptrain.training.checkpoint import load_checkpoint
from mlptrain.training.experiment import Resources
from mlptrain.training.monitor import TrainingMonitor
from tests.packing.test_lanes import build, tiny
from tests.sweep.conftest import tiny_mnist  # noqa: F401 (a fixture: a small banded MNIST in place of the real one)

THREE_EPOCHS = {"train__epochs": 3, "train__checkpoint_every_epochs": 3, "train__log_every": 2}


@pytest.fixture
def queued(monkeypatch):
    """The epochs whose ends were queued, by run folder name."""
    ends, real = [], loop.queue_end

    def counting(s, epoch, *args):
        ends.append(epoch)
        return real(s, epoch, *args)

    monkeypatch.setattr(loop, "queue_end", counting)
    return ends


@pytest.fixture
def reads(monkeypatch):
    """Every read the monitors were handed, by run folder, without its seconds."""
    seen, real = {}, TrainingMonitor.__call__

    def recording(self, read):
        assert read["seconds"] > 0  # a rate for every read: the last two of a queued end share their seconds
        seen.setdefault(self.logger.run_dir.name, []).append({k: v for k, v in read.items() if k != "seconds"})
        real(self, read)

    monkeypatch.setattr(TrainingMonitor, "__call__", recording)
    return seen


@pytest.mark.parametrize("log_every", [2, 100])  # five reads an epoch, the last two held; one, at its end
def test_a_lanes_queued_epoch_ends_give_the_runs_reads_records_and_bits_alone(tiny_mnist, tmp_path, queued,
                                                                             reads, log_every):
    config = tiny(optim__lr=0.004, **{**THREE_EPOCHS, "train__log_every": log_every})
    alone, _ = run_seeds(config, [0, 1], tmp_path, "alone", "tiny", Resources(), pack=1)
    assert queued == []  # a run alone ends its epochs at once
    alone_reads = dict(reads)
    reads.clear()
    packed, _ = run_seeds(config, [0, 1], tmp_path, "packed", "tiny", Resources(), pack=2)
    assert sorted(queued) == [1, 1, 2, 2]  # both lanes, every epoch but the last (its checkpoint is due)
    for seed in (0, 1):
        run = f"seed-{seed}"
        assert reads[run] == alone_reads[run]  # in order
        if log_every == 2:
            assert len(reads[run]) == 15
            assert [(r["epoch"], r["step_in_epoch"]) for r in reads[run][3:7]] == [(1, 8), (1, 9), (2, 2), (2, 4)]
        else:
            assert [(r["epoch"], r["step_in_epoch"]) for r in reads[run]] == [(1, 9), (2, 9), (3, 9)]
        for name in ("metrics.jsonl", "grad_norms.npy"):
            assert (packed / run / name).read_bytes() == (alone / run / name).read_bytes(), name
        a, p = (json.loads((g / run / "summary.json").read_text()) for g in (alone, packed))
        assert {k: a[k] for k in ("val_loss", "val_acc", "test_loss", "test_acc", "best_epoch")} == \
            {k: p[k] for k in ("val_loss", "val_acc", "test_loss", "test_acc", "best_epoch")}
        for name in ("last", "best"):
            a, p = (load_checkpoint(g / run / "checkpoints" / f"{name}.npz") for g in (alone, packed))
            assert sorted(a) == sorted(p)
            for key in a:
                if key != "meta/wall_s":
                    np.testing.assert_array_equal(a[key], p[key], err_msg=f"{run} {name} {key}")



def test_a_lanes_test_split_is_captured_while_it_trains_for_its_pass_at_the_end(tiny_mnist, tmp_path, monkeypatch):
    """A lane whose test split is evaluated once, at its run's end (train.eval_test end), asks for its graph at
    each queued epoch end, while the group trains (the capture is made once, where the backend has graphs:
    Evaluator.capture_ahead); a run alone, whose epochs end at once, does not."""
    from mlptrain.training.evaluation import Evaluator

    asked, real = [], Evaluator.capture_ahead

    def recording(self, split):
        asked.append(split.size)
        real(self, split)

    monkeypatch.setattr(Evaluator, "capture_ahead", recording)
    config = tiny(optim__lr=0.004, **THREE_EPOCHS)
    run_seeds(config, [0, 1], tmp_path, "alone", "tiny", Resources(), pack=1)
    assert asked == []
    packed, _ = run_seeds(config, [0, 1], tmp_path, "packed", "tiny", Resources(), pack=2)
    assert len(asked) == 4 and len(set(asked)) == 1  # two lanes, two queued ends each, the test split each time
    assert all("test_acc" in json.loads((packed / f"seed-{seed}" / "summary.json").read_text()) for seed in (0, 1))


def test_a_best_epoch_whose_end_was_queued_is_the_checkpoint_held(tiny_mnist, tmp_path, queued, monkeypatch):
    """The best epoch (an earlier one than the last) is written from the copies queued at its end, not from the
    parameters of later steps."""
    config = tiny(optim__lr=0.004, **THREE_EPOCHS)
    real = loop._after_evaluation

    def best_at_epoch_one(s, run_dir, record, best, *copies):  # later epochs never improve on the first
        return real(s, run_dir, {**record, "val_acc": 1.0 if record["epoch"] == 1 else 0.0}, best, *copies)

    monkeypatch.setattr(loop, "_after_evaluation", best_at_epoch_one)
    runs = {pack: run_seeds(config, [0, 1], tmp_path, f"pack-{pack}", "tiny", Resources(), pack=pack)[0]
            for pack in (1, 2)}
    assert sorted(queued) == [1, 1, 2, 2]
    for seed in (0, 1):
        a, p = (load_checkpoint(runs[pack] / f"seed-{seed}" / "checkpoints" / "best.npz") for pack in (1, 2))
        assert int(p["meta/epoch"]) == 1 and int(p["meta/best_epoch"]) == 1
        for key in a:
            if key != "meta/wall_s":
                np.testing.assert_array_equal(a[key], p[key], err_msg=f"seed {seed} {key}")


def test_a_stop_at_a_queued_epoch_end_writes_its_record_then_a_checkpoint_at_it(tiny_mnist, tmp_path, queued,
                                                                               monkeypatch):
    stop, real = SimpleNamespace(signum=0), loop.queue_end

    def stopping(*args):  # as Ctrl-C right after the epoch's last step
        end = real(*args)
        stop.signum = signal.SIGINT
        return end

    monkeypatch.setattr(loop, "queue_end", stopping)
    with pytest.raises(TrainingInterrupted):
        run_seeds(tiny(**THREE_EPOCHS), [0, 1], tmp_path, "g", "tiny", Resources(), stop=stop, pack=2)
    for seed in (0, 1):
        run = tmp_path / "g" / f"seed-{seed}"
        assert [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1]
        last = load_checkpoint(run / "checkpoints" / "last.npz")
        assert (int(last["meta/epoch"]), int(last["meta/window"])) == (1, 0)  # at the epoch's end, as at once
        assert (run / "checkpoints" / "best.npz").exists()  # epoch 1, held from its queued copies


def test_a_diverged_last_read_of_a_queued_end_writes_no_record(tiny_mnist, tmp_path, monkeypatch):
    """As at once: the epoch's last read raising, its evaluation is never recorded."""
    real = TrainingMonitor.__call__

    def diverging(self, read):
        if (read["epoch"], read["step_in_epoch"]) == (1, 9):
            raise TrainingDiverged("the training loss became nan (injected)")
        real(self, read)

    monkeypatch.setattr(TrainingMonitor, "__call__", diverging)
    with pytest.raises(TrainingDiverged, match="injected"):
        run_seeds(tiny(**THREE_EPOCHS), [0, 1], tmp_path, "g", "tiny", Resources(), pack=2)
    for seed in (0, 1):
        assert (tmp_path / "g" / f"seed-{seed}" / "metrics.jsonl").read_text() == ""


def test_a_diverged_evaluation_of_a_queued_end_is_recorded_then_raised(tiny_mnist, tmp_path, monkeypatch):
    real = loop.queued_record
    monkeypatch.setattr(loop, "queued_record", lambda s, end: {**real(s, end), "val_loss": float("nan")})
    with pytest.raises(TrainingDiverged, match="validation loss became nan after epoch 1"):
        run_seeds(tiny(**THREE_EPOCHS), [0, 1], tmp_path, "g", "tiny", Resources(), pack=2)
    for seed in (0, 1):
        lines = (tmp_path / "g" / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["epoch"] for line in lines] == [1]


@pytest.mark.parametrize("change, queues", [
    ({}, True),
    ({"train__early_stopping": {"patience": 2}}, False),  # an epoch's end may end the run
    ({"schedule__name": "plateau"}, False),  # an epoch's end sets the next epoch's lr
    ({"train__checkpoint_every_epochs": 1}, False),  # every epoch's end writes a checkpoint
    ({"train__epochs": 1}, False),
])
def test_epoch_ends_are_queued_only_where_nothing_decided_there_changes_the_next_epoch(tiny_mnist, change, queues):
    config = tiny(**{**THREE_EPOCHS, **change})
    group, sessions = build(config)
    assert queued_end.queues_ends(sessions[0], evaluation_stops=False) is queues
    assert queued_end.queues_ends(sessions[0], evaluation_stops=True) is False  # a sweep that prunes
    group.stagger = True  # staggered lanes end their epochs while the others step
    assert queued_end.queues_ends(sessions[0], evaluation_stops=False) is False


def test_a_group_whose_copies_would_crowd_pinned_memory_ends_its_epochs_at_once(tiny_mnist, monkeypatch):
    _, sessions = build(tiny(**THREE_EPOCHS))
    held = sum(a.nbytes for a in queued_end.device_arrays(sessions[0].model, sessions[0].step))
    monkeypatch.setattr(queued_end, "PINNED_LIMIT", 2 * 2 * 2 * held)
    assert queued_end.queues_ends(sessions[0], evaluation_stops=False)
    monkeypatch.setattr(queued_end, "PINNED_LIMIT", 2 * 2 * 2 * held - 1)
    assert not queued_end.queues_ends(sessions[0], evaluation_stops=False)


def test_a_sweep_that_prunes_ends_its_epochs_at_once(tmp_path, tiny_mnist, queued):
    from tests.sweep.test_sweep import run_sweep, write_sweep

    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002]}, prune=True)
    run_sweep(path, tmp_path / "runs", overrides=["train.epochs=3"], name="pruning", pack=2)
    assert queued == []  # its pruner decides from each epoch's report
    path = write_sweep(tmp_path, {"optim.lr": [0.001, 0.002]})
    run_sweep(path, tmp_path / "runs", overrides=["train.epochs=3"], name="not-pruning", pack=2)
    assert sorted(queued) == [1, 1, 2, 2]

