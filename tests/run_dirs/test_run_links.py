"""Nothing is written through a link in a run folder (its lock, metrics.jsonl, checkpoints, TensorBoard events, a
sweep's logs and study), and a run whose files link elsewhere is refused in one line before it is read."""

import os

import pytest

from mlptrain.errors import UserError
from mlptrain.run_dirs.links import check_no_links, checkpoint_file
from mlptrain.run_dirs.lock import LOCK_NAME, lock_run, release_run
from mlptrain.run_dirs.records import RunLogger
from mlptrain.sweep.storage import default_storage
from mlptrain.sweep.workers import _start
from mlptrain.training.resume import prepare_resume
from mlptrain.util.regular_file import open_regular
from tests.run_dirs.test_run_safety import trained_run


@pytest.fixture
def outside(tmp_path):
    """A file outside every run, which nothing may touch."""
    path = tmp_path / "outside.txt"
    path.write_text("precious\n")
    return path


def relink(path, target):
    """`path` replaced by a symbolic link to `target`."""
    if path.is_dir() and not path.is_symlink():
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(target)


def test_a_lock_that_links_outside_is_refused_and_not_overwritten(tmp_path, outside):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).symlink_to(outside)
    with pytest.raises(UserError, match=f"{run / LOCK_NAME}: a symbolic link, not the run's own file; mlptrain "
                                        "writes nothing through it"):
        lock_run(run, "--resume")
    (run / LOCK_NAME).unlink()
    os.link(outside, run / LOCK_NAME)  # a hard link writes the other file as surely
    with pytest.raises(UserError, match="a hard link to another file"):
        lock_run(run, "--resume")
    assert outside.read_text() == "precious\n"


def test_a_metrics_file_that_links_outside_is_not_appended_to(tmp_path, outside):
    (tmp_path / "metrics.jsonl").symlink_to(outside)
    with pytest.raises(UserError, match="metrics.jsonl: cannot append to it \\(a symbolic link, not the run's own"):
        RunLogger(tmp_path)
    assert outside.read_text() == "precious\n"
    assert not list(tmp_path.glob("events.out.tfevents.*"))  # refused before the event file is made


def test_a_followed_open_still_reads_a_users_own_link(tmp_path, outside):
    (tmp_path / "mine.txt").symlink_to(outside)
    with open_regular(tmp_path / "mine.txt", "r") as file:  # a user's input may be a link: only runs refuse them
        assert file.read() == "precious\n"
    with pytest.raises(OSError, match="a symbolic link"):
        open_regular(tmp_path / "mine.txt", "r", follow=False)


@pytest.mark.parametrize("entry", [LOCK_NAME, "metrics.jsonl", "config.yaml", "summary.json", "checkpoints",
                                   "checkpoints/last.npz"])
def test_resume_refuses_a_run_with_a_link_before_it_touches_anything(tmp_path, outside, entry):
    """The issue's `--resume` example among them: a .lock linking outside was truncated to the pid."""
    run = trained_run(tmp_path)
    target = outside if entry != "checkpoints" else tmp_path / "elsewhere"
    if entry == "checkpoints":
        target.mkdir()
    relink(run / entry, target)
    with pytest.raises(UserError, match=f"{run / entry}: a symbolic link \\(to {target}\\) inside a run folder; "
                                        "mlptrain never reads or writes a run's files through a link"):
        prepare_resume(run, ["train.epochs=2"])
    release_run(run)
    assert outside.read_text() == "precious\n"


def test_a_checkpoints_folder_linked_elsewhere_is_never_written_into(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    assert checkpoint_file(run, "last") == run / "checkpoints" / "last.npz"  # made when missing
    relink(run / "checkpoints", elsewhere)  # swapped in while the run trains
    with pytest.raises(UserError, match="checkpoints: a symbolic link"):
        checkpoint_file(run, "last")
    check_no_links(tmp_path / "absent")  # a missing folder is the command's own refusal, not this one's


def test_event_files_have_names_nobody_could_link_beforehand(tmp_path):
    """tensorboardX opens its event file with open(name, "wb"); its name was the second and the host."""
    logger = RunLogger(tmp_path)
    logger.close()
    other = RunLogger(tmp_path)
    other.close()
    names = sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))
    assert len(names) == 2 and all(len(name.rsplit(".", 1)[-1]) == 8 for name in names), names


def test_a_sweeps_logs_and_study_are_not_written_through_links(tmp_path, outside):
    (tmp_path / "worker-1.log").symlink_to(outside)
    with pytest.raises(UserError, match="worker-1.log: cannot append to it \\(a symbolic link"):
        _start(["true"], [None], tmp_path, 1)
    (tmp_path / "study.journal").symlink_to(outside)
    with pytest.raises(UserError, match="study.journal: a symbolic link inside a sweep folder"):
        default_storage(tmp_path)
    assert outside.read_text() == "precious\n"


def test_evaluate_and_compare_refuse_a_run_that_links_outside(tiny_runs, tmp_path, outside):
    """The issue's `evaluate` example: the run's lock linking outside was overwritten with the pid."""
    import shutil

    from tests.cli.test_cli import assert_clean_failure, mlptrain

    run = tmp_path / "run"
    shutil.copytree(tiny_runs["mlp"], run)
    relink(run / LOCK_NAME, outside)
    result = mlptrain("evaluate", str(run), cwd=tmp_path)
    assert_clean_failure(result, f"{run / LOCK_NAME}: a symbolic link (to {outside}) inside a run folder")
    relink(run / LOCK_NAME, tmp_path / "nothing")  # dangling: nothing may be made there either
    assert_clean_failure(mlptrain("evaluate", str(run), cwd=tmp_path), f"{run / LOCK_NAME}: a symbolic link")
    (run / LOCK_NAME).unlink()
    relink(run / "summary.json", tiny_runs["ae"] / "summary.json")  # another run's results, reported as this one's
    result = mlptrain("compare", str(run), str(tiny_runs["mlp"]), cwd=tmp_path)
    assert_clean_failure(result, f"{run / 'summary.json'}: a symbolic link (to {tiny_runs['ae'] / 'summary.json'})")
    assert outside.read_text() == "precious\n" and not (tmp_path / "nothing").exists()
