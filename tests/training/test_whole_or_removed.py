"""A run that ends for want of memory or of a reader: a new run with nothing to resume is removed (its name
free again), one with a checkpoint keeps it; a failed allocation is one line."""

import pytest

from mlptrain.config.load import load_config
from mlptrain.cli.configs import resolve_config
from mlptrain.errors import OutputClosed, TrainingDiverged, TrainingInterrupted, UserError
from mlptrain.run_dirs.lock import release_run
from mlptrain.training.experiment import create_run, whole_or_removed


@pytest.fixture
def new_run(tmp_path):
    config = load_config(resolve_config("adam_mnist"), ["backend=cpu"])
    run_dir = create_run(config, tmp_path / "runs", "r", "adam_mnist")
    yield run_dir
    release_run(run_dir)


def test_memory_error_removes_a_new_run_and_says_one_line(new_run):
    (new_run / "metrics.jsonl").write_text("")
    (new_run / "events.out.tfevents.1").write_bytes(b"x")
    with pytest.raises(UserError, match="out of memory: allocating 8 GiB") as caught:
        with whole_or_removed(new_run, new=True):
            raise MemoryError("Unable to allocate 8 GiB for an array with shape (1,)")
    assert "\n" not in str(caught.value)
    assert not new_run.exists()


def test_a_closed_output_removes_a_new_run_and_goes_on_as_itself(new_run):
    with pytest.raises(OutputClosed):
        with whole_or_removed(new_run, new=True):
            raise OutputClosed()
    assert not new_run.exists()


def test_a_run_with_a_checkpoint_or_a_resumed_one_is_kept(new_run):
    (new_run / "checkpoints").mkdir()
    (new_run / "checkpoints" / "last.npz").write_bytes(b"x")
    with pytest.raises(UserError, match="keeps its last checkpoint"):
        with whole_or_removed(new_run, new=True):
            raise RuntimeError("can't start new thread")
    assert (new_run / "checkpoints" / "last.npz").is_file()
    (new_run / "checkpoints" / "last.npz").unlink()
    with pytest.raises(OutputClosed):
        with whole_or_removed(new_run, new=False):
            raise OutputClosed()
    assert (new_run / "config.yaml").is_file()


def test_other_errors_pass_untouched(new_run):
    with pytest.raises(RuntimeError, match="something else"):
        with whole_or_removed(new_run, new=True):
            raise RuntimeError("something else")
    assert new_run.exists()


def test_a_new_run_refused_before_its_first_record_is_removed(new_run, monkeypatch):
    """Too little disk for its checkpoints: the refusal comes from inside training, after the folder was made."""
    from mlptrain.backends.cpu import CpuBackend
    from mlptrain.training.loop import train
    from mlptrain.training.session import build_session
    from tests.training.test_accumulation import make_config, synthetic_dataset

    session = build_session(make_config(64, 1), CpuBackend(), synthetic_dataset())
    monkeypatch.setattr("shutil.disk_usage", lambda path: type("Usage", (), {"free": 2**10})())
    with pytest.raises(UserError, match="MiB free on its disk"):
        with whole_or_removed(new_run, new=True):
            train(session, new_run)
    assert not new_run.exists()


@pytest.mark.parametrize("kind", [TrainingDiverged, TrainingInterrupted])
def test_a_run_that_diverged_or_was_interrupted_keeps_its_folder(new_run, kind):
    with pytest.raises(kind):
        with whole_or_removed(new_run, new=True):
            raise kind("the training loss became nan") if kind is TrainingDiverged else kind("stopped", 15)
    assert (new_run / "config.yaml").is_file()


def test_a_refusal_after_records_or_on_a_resumed_run_keeps_the_folder(new_run):
    with pytest.raises(UserError):
        with whole_or_removed(new_run, new=False):
            raise UserError("a refusal")
    (new_run / "metrics.jsonl").write_text('{"epoch": 1, "step": 4}\n')
    with pytest.raises(UserError):
        with whole_or_removed(new_run, new=True):
            raise UserError("a refusal")
    assert (new_run / "config.yaml").is_file()
