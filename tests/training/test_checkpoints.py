"""When the checkpoints are written: `last` every train.checkpoint_every_epochs, at the end and at a stop, and
`best` with it, so best.npz never records a later epoch than last.npz (a resume from `last` would otherwise
find a `best` from its own future). A sweep's trials write theirs once, at their end (mlptrain.sweep.spec)."""

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from mlptrain.backends.cpu import CpuBackend
from mlptrain.errors import TrainingInterrupted, UserError
from mlptrain.training import checkpoint_writes
from mlptrain.training.checkpoint import load_checkpoint
from mlptrain.training.loop import train
from mlptrain.training.session import build_session
from tests.training.test_accumulation import make_config, synthetic_dataset
from tests.training.test_resume import new_run

ADAM = {"name": "adam", "lr": 0.01}  # val_acc improves in every one of the first epochs


def epochs_on_disk(run) -> dict[str, int]:
    return {p.stem: int(load_checkpoint(p)["meta/epoch"]) for p in sorted((run / "checkpoints").glob("*.npz"))}


def test_best_is_written_with_last_and_never_ahead_of_it(tmp_path):
    config = make_config(64, 4, ADAM, None, epochs=5, checkpoint_every_epochs=3)
    run = new_run(tmp_path, "run", config)
    seen = []
    session = build_session(config, CpuBackend(), synthetic_dataset())

    def on_evaluation(record):
        if session.writing is not None:  # the files an epoch's end writes are on their way (a thread writes them)
            session.writing.exception()
        seen.append(epochs_on_disk(run))

    summary = train(session, run, on_evaluation=on_evaluation)
    # after epochs 1 and 2 nothing yet; epoch 3 writes last and the best so far; the end writes both again
    assert seen[:2] == [{}, {}]
    assert seen[2]["last"] == 3 and 1 <= seen[2]["best"] <= 3
    final = epochs_on_disk(run)
    assert final["last"] == 5 and final["best"] == summary["best_epoch"]
    assert all(state.get("best", 0) <= state.get("last", 0) for state in seen)


def test_a_stop_writes_the_pending_best_beside_last(tmp_path):
    config = make_config(64, 4, ADAM, None, epochs=5, checkpoint_every_epochs=5)
    run = new_run(tmp_path, "run", config)
    stop = SimpleNamespace(signum=None)

    def stop_after_epoch_2(record):
        if record["epoch"] == 2:
            stop.signum = 2
    try:
        train(build_session(config, CpuBackend(), synthetic_dataset()), run, on_evaluation=stop_after_epoch_2,
              stop=stop)
    except TrainingInterrupted:
        pass
    else:
        raise AssertionError("the run was not stopped")
    state = epochs_on_disk(run)
    assert state["last"] == 2 and 1 <= state["best"] <= 2


def test_best_written_with_last_from_the_same_arrays_is_the_same_file(tmp_path):
    """An epoch that is the best so far writes `last` and `best` from the same arrays: `best` is then a second
    name of `last`'s file (8 MB not written again), and the next `last` replaces its own name only."""
    config = make_config(64, 4, ADAM, None, epochs=2, checkpoint_every_epochs=1)
    run = new_run(tmp_path, "run", config)
    seen = []
    session = build_session(config, CpuBackend(), synthetic_dataset())

    def on_disk(record):
        session.writing.exception()  # the epoch's files are on their way (a thread writes them)
        last, best = run / "checkpoints" / "last.npz", run / "checkpoints" / "best.npz"
        seen.append((record["epoch"], last.samefile(best), last.read_bytes() == best.read_bytes(),
                     int(load_checkpoint(best)["meta/epoch"])))
    summary = train(session, run, on_evaluation=on_disk)
    assert summary["best_epoch"] == 2  # val_acc improves in both epochs (ADAM): each epoch is the best so far
    assert seen == [(1, True, True, 1), (2, True, True, 2)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.npz", "last.npz"]  # no temporary


def test_best_held_from_an_earlier_epoch_is_written_from_its_own_arrays(tmp_path):
    config = make_config(64, 4, ADAM, None, epochs=5, checkpoint_every_epochs=3)
    run = new_run(tmp_path, "run", config)
    train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    state = epochs_on_disk(run)
    last, best = run / "checkpoints" / "last.npz", run / "checkpoints" / "best.npz"
    assert last.samefile(best) == (state["best"] == state["last"] == 5)


def test_a_held_best_holds_its_own_epochs_parameters(tmp_path):
    """The best epoch's checkpoint is copied at that epoch's end (behind the host on a GPU) and written epochs
    later: it holds that epoch's parameters, not the ones training went on to."""
    config = make_config(64, 4, {"name": "adam", "lr": 0.05}, None, epochs=6, checkpoint_every_epochs=6)
    run = new_run(tmp_path, "run", config)
    session = build_session(config, CpuBackend(), synthetic_dataset())
    params = {}
    summary = train(session, run, on_evaluation=lambda record: params.setdefault(
        record["epoch"], session.model.params.to_host_dict(prefix="params/")))
    best = load_checkpoint(run / "checkpoints" / "best.npz")
    epoch = int(best["meta/epoch"])
    assert epoch == summary["best_epoch"]
    for name, array in params[epoch].items():
        assert (best[name] == array).all(), name
    assert epoch < 6  # lr 0.05 peaks early (epoch 2): held for four epochs while the parameters moved on
    assert any((best[name] != array).any() for name, array in params[6].items())


def test_a_checkpoint_write_that_fails_ends_the_run_in_one_line_and_keeps_the_previous(tmp_path, monkeypatch):
    """Checkpoints are written by a thread behind the training: a write that fails (a full disk) ends the run
    by its next checkpoint with the write's one line, the file it was to replace intact, and no summary."""
    config = make_config(64, 4, ADAM, None, epochs=5, checkpoint_every_epochs=1)
    run = new_run(tmp_path, "run", config)
    real, calls = checkpoint_writes.save_checkpoint, []

    def failing(path, arrays):
        calls.append(path.name)
        if len(calls) == 3:
            raise UserError(f"{path}: cannot write it (No space left on device); the previous file, if any, is intact")
        real(path, arrays)

    monkeypatch.setattr(checkpoint_writes, "save_checkpoint", failing)
    with pytest.raises(UserError, match="last.npz: cannot write it \\(No space left on device\\)"):
        train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert calls[2] == "last.npz" and 3 <= len(calls) <= 4  # at most one epoch's end went on before it was seen
    assert epochs_on_disk(run)["last"] == 2 and not (run / "summary.json").exists()


class _Lent:
    """Host copies lent as they land (a GPU's pinned buffer): `drop` gives them back, after which they are not
    to be read."""

    mark = None  # copied at once (Backend.to_host_later's copies made at once have none)

    def __init__(self, arrays, lent):
        self.arrays, self.dropped, self.viewed = arrays, False, False
        lent.append(self)

    def views(self):
        assert not self.dropped, "read after its buffer went back"
        self.viewed = True
        return self.arrays

    def take(self):
        assert not self.dropped
        return [array.copy() for array in self.arrays]

    def drop(self):
        self.dropped = True


@pytest.mark.parametrize("fails", [False, True])
def test_a_checkpoint_is_written_from_its_copies_then_gives_them_back(tmp_path, monkeypatch, fails):
    """A checkpoint's arrays are the copies' own memory (pinned, on a GPU: no copy of 8 MB a lane on the thread
    that feeds the GPU), so they are given back only once its files are written, or their write failed."""
    lent = []

    class Backend(CpuBackend):
        def to_host_later(self, arrays):
            return _Lent([self.to_host(array) for array in arrays], lent)

    config = make_config(64, 4, ADAM, None, epochs=3, checkpoint_every_epochs=1)
    run = new_run(tmp_path, "run", config)
    real, written = checkpoint_writes.save_checkpoint, []

    def save(path, arrays):
        params = next(array for key, array in arrays.items() if key.startswith("params/"))
        (source,) = [copies for copies in lent if np.shares_memory(copies.arrays[0], params)]
        assert not source.dropped  # written from the copies themselves, not yet given back
        if fails and path.name == "last.npz" and written:
            raise UserError(f"{path}: cannot write it (No space left on device)")
        written.append(path.name)
        real(path, arrays)

    monkeypatch.setattr(checkpoint_writes, "save_checkpoint", save)
    session = build_session(config, Backend(), synthetic_dataset())
    if fails:
        with pytest.raises(UserError, match="No space left"):
            train(session, run)
    else:
        train(session, run)
    checkpoints = [copies for copies in lent if copies.viewed]
    assert len(checkpoints) >= 2 and all(copies.dropped for copies in checkpoints)


def hidden(run) -> list[str]:
    """The checkpoints folder's hidden files: a best written ahead of `last`, not yet renamed."""
    return sorted(p.name for p in (run / "checkpoints").glob(".*")) if (run / "checkpoints").exists() else []


@pytest.fixture
def scripted(monkeypatch):
    """val_acc of each epoch as the test gives it (`scripted.accuracies`), and the writes ahead of `last` by the
    epoch they held, the files discarded, in order."""
    from mlptrain.training import loop

    real_after, real_ahead, real_discard = loop._after_evaluation, checkpoint_writes.save_checkpoint_ahead, \
        checkpoint_writes.discard_ahead
    log = SimpleNamespace(accuracies=None, events=[], discarded_by=[])

    def after(s, run_dir, record, best, *copies):
        if log.accuracies is not None:
            record = {**record, "val_acc": log.accuracies[record["epoch"] - 1]}
        return real_after(s, run_dir, record, best, *copies)

    def ahead(path, arrays):
        log.events.append(("ahead", int(arrays["meta/epoch"])))
        return real_ahead(path, arrays)

    def discard(tmp):
        log.events.append(("discard", tmp.name.startswith(".best.npz.")))
        log.discarded_by.append(threading.current_thread())
        real_discard(tmp)

    monkeypatch.setattr(loop, "_after_evaluation", after)
    monkeypatch.setattr(checkpoint_writes, "save_checkpoint_ahead", ahead)
    monkeypatch.setattr(checkpoint_writes, "discard_ahead", discard)
    return log


def test_a_held_best_that_outlives_an_evaluation_is_written_ahead_and_named_best_after_last(tmp_path, scripted):
    """A run that writes `last` only at its end holds its best epoch's checkpoint until then: once a later
    evaluation does not beat it, it is written to a hidden file while training goes on, renamed to best.npz only
    once last.npz is written (never ahead of it), and holds the same arrays as one written at the end."""
    config = make_config(64, 4, ADAM, None, epochs=5, checkpoint_every_epochs=5)
    scripted.accuracies = [0.5, 0.9, 0.8, 0.7, 0.6]  # epoch 2 stays the best
    run = new_run(tmp_path, "run", config)
    session = build_session(config, CpuBackend(), synthetic_dataset())
    seen = []

    def on_evaluation(record):
        if session.writing is not None:
            session.writing.exception()
        seen.append((record["epoch"], epochs_on_disk(run), hidden(run)))

    train(session, run, on_evaluation=on_evaluation)
    assert scripted.events == [("ahead", 2)]  # once, at epoch 3 (written again at no later epoch)
    # nothing named before the last epoch's end, which renames it once last.npz is written
    assert [state for _, state, _ in seen] == [{}] * 4 + [{"best": 2, "last": 5}]
    assert [len(files) for _, _, files in seen] == [0, 0, 1, 1, 0]
    assert epochs_on_disk(run) == {"best": 2, "last": 5} and hidden(run) == []

    # the same files as a run that writes its held best at the end
    scripted.events.clear()
    again = new_run(tmp_path, "again", config)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checkpoint_writes, "write_best_ahead", lambda s, run_dir: None)
        from mlptrain.training import loop

        patch.setattr(loop, "write_best_ahead", lambda s, run_dir: None)
        train(build_session(config, CpuBackend(), synthetic_dataset()), again)
    assert scripted.events == []
    for name in ("best", "last"):
        a, b = (load_checkpoint(r / "checkpoints" / f"{name}.npz") for r in (run, again))
        assert sorted(a) == sorted(b)
        for key in a:
            if key != "meta/wall_s":
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name} {key}")


def test_a_best_written_ahead_that_a_later_epoch_beats_is_discarded(tmp_path, scripted):
    config = make_config(64, 4, ADAM, None, epochs=5, checkpoint_every_epochs=5)
    scripted.accuracies = [0.6, 0.5, 0.9, 0.8, 0.95]  # epoch 1 outlives epoch 2; epoch 3 outlives 4; epoch 5 wins
    run = new_run(tmp_path, "run", config)
    train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert scripted.events == [("ahead", 1), ("discard", True), ("ahead", 3), ("discard", True)]
    assert epochs_on_disk(run) == {"best": 5, "last": 5} and hidden(run) == []
    # removed by a writer thread, not the training's (16 lanes' unlinks in a row held up a packed sweep's end)
    assert threading.current_thread() not in scripted.discarded_by
    assert (run / "checkpoints" / "best.npz").samefile(run / "checkpoints" / "last.npz")


def test_a_stop_after_a_best_was_written_ahead_names_it_best_beside_last(tmp_path, scripted):
    config = make_config(64, 4, ADAM, None, epochs=5, checkpoint_every_epochs=5)
    scripted.accuracies = [0.9, 0.5, 0.5, 0.5, 0.5]
    run = new_run(tmp_path, "run", config)
    stop = SimpleNamespace(signum=None)

    def stop_after_epoch_3(record):
        if record["epoch"] == 3:
            stop.signum = 2

    with pytest.raises(TrainingInterrupted):
        train(build_session(config, CpuBackend(), synthetic_dataset()), run, on_evaluation=stop_after_epoch_3,
              stop=stop)
    assert scripted.events == [("ahead", 1)]
    assert epochs_on_disk(run) == {"best": 1, "last": 3} and hidden(run) == []


def test_a_run_that_fails_after_a_best_was_written_ahead_leaves_no_hidden_file(tmp_path, scripted):
    config = make_config(64, 4, ADAM, None, epochs=5, checkpoint_every_epochs=5)
    scripted.accuracies = [0.9, 0.5, 0.5, 0.5, 0.5]

    def failing(record):
        if record["epoch"] == 3:
            raise UserError("a failure after epoch 3")

    run = new_run(tmp_path, "run", config)
    with pytest.raises(UserError, match="after epoch 3"):
        train(build_session(config, CpuBackend(), synthetic_dataset()), run, on_evaluation=failing)
    assert scripted.events == [("ahead", 1), ("discard", True)]
    assert epochs_on_disk(run) == {} and hidden(run) == []


def test_a_best_whose_write_ahead_failed_is_written_with_last(tmp_path, scripted, monkeypatch):
    """A write ahead that fails (a full disk then) is not the run's error: the best is written with `last`, where a
    fault that lasts ends the run as before."""
    config = make_config(64, 4, ADAM, None, epochs=4, checkpoint_every_epochs=4)
    scripted.accuracies = [0.9, 0.5, 0.5, 0.5]

    def full(path, arrays):
        scripted.events.append(("ahead", int(arrays["meta/epoch"])))
        raise UserError(f"{path}: cannot write it (No space left on device)")

    monkeypatch.setattr(checkpoint_writes, "save_checkpoint_ahead", full)
    run = new_run(tmp_path, "run", config)
    train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert scripted.events == [("ahead", 1)]
    assert epochs_on_disk(run) == {"best": 1, "last": 4} and hidden(run) == []


def test_a_best_written_ahead_by_a_killed_process_is_removed_when_its_run_trains_again(tmp_path):
    config = make_config(64, 4, ADAM, None, epochs=1, checkpoint_every_epochs=1)
    run = new_run(tmp_path, "run", config)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".best.npz.0badf00d.tmp").write_bytes(b"a best written ahead, never renamed")
    (run / "checkpoints" / ".notes").write_text("not a checkpoint's")
    train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert hidden(run) == [".notes"] and epochs_on_disk(run) == {"best": 1, "last": 1}


def test_a_last_checkpoint_refused_after_a_best_was_written_ahead_leaves_no_hidden_file(tmp_path, scripted,
                                                                                         monkeypatch):
    from mlptrain.errors import TrainingDiverged
    from mlptrain.training.resume import HeldCheckpoint

    config = make_config(64, 4, ADAM, None, epochs=4, checkpoint_every_epochs=4)
    scripted.accuracies = [0.9, 0.5, 0.5, 0.5]
    real = HeldCheckpoint.arrays

    def arrays(self):
        taken = real(self)
        if int(taken["meta/epoch"]) == 4:
            raise TrainingDiverged("the parameters became non-finite by optimizer step 16")
        return taken

    monkeypatch.setattr(HeldCheckpoint, "arrays", arrays)
    run = new_run(tmp_path, "run", config)
    with pytest.raises(TrainingDiverged):
        train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert scripted.events == [("ahead", 1), ("discard", True)]
    assert epochs_on_disk(run) == {} and hidden(run) == []


def test_a_checkpoints_link_is_not_cleaned_through_before_the_run_refuses_it(tmp_path):
    config = make_config(64, 4, ADAM, None, epochs=1, checkpoint_every_epochs=1)
    run = new_run(tmp_path, "run", config)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".best.npz.0badf00d.tmp").write_bytes(b"not this run's")
    (run / "checkpoints").symlink_to(elsewhere)
    with pytest.raises(UserError, match="a symbolic link"):
        train(build_session(config, CpuBackend(), synthetic_dataset()), run)
    assert (elsewhere / ".best.npz.0badf00d.tmp").read_bytes() == b"not this run's"
