"""mlptrain.util.atomic: a file is replaced whole or not at all, and its data reach the disk before the rename."""

import errno
import os

import numpy as np
import pytest

from mlptrain.errors import UserError
from mlptrain.run_dirs.folders import write_yaml
from mlptrain.run_dirs.records import write_json
from mlptrain.training.checkpoint import load_checkpoint, save_checkpoint
from mlptrain.util import atomic


def test_the_new_content_replaces_the_file_after_an_fsync(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old")
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: events.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: events.append("replace") or real_replace(a, b))
    write_json(path, {"test_acc": 0.5, "val_loss": float("nan")})
    assert events == ["fsync", "replace"]
    assert path.read_text() == '{\n  "test_acc": 0.5,\n  "val_loss": null\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_an_error_while_writing_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("old")
    with pytest.raises(KeyError):
        with atomic.atomic_write(path) as file:
            file.write("half a file")
            raise KeyError("boom")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_a_full_disk_is_one_line_naming_the_file_and_the_checkpoint_survives(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.npz"
    save_checkpoint(path, {"params/w": np.arange(3.0)})

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(UserError, match=r"last\.npz: cannot write it \(No space left on device\)"):
        save_checkpoint(path, {"params/w": np.zeros(3)})
    np.testing.assert_array_equal(load_checkpoint(path)["params/w"], np.arange(3.0))
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.npz"]


def test_an_unwritable_folder_is_one_line(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.raises(UserError, match="not-a-folder/config.yaml: cannot write it"):
        write_yaml(blocker / "config.yaml", {"seed": 0})


def test_a_new_file_gets_the_umasks_permissions_like_any_file_the_user_writes(tmp_path):
    old = os.umask(0o022)
    try:
        atomic.write_text(tmp_path / "config.yaml", "seed: 0\n")
        with atomic.replacing(tmp_path / "entry.kernel", durable=False) as file:
            file.write(b"x")
    finally:
        os.umask(old)
    # mkstemp's 0600 would hide a shared data root's downloads and caches from its other users
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()} == {"config.yaml": 0o644,
                                                                             "entry.kernel": 0o644}


def test_a_cache_write_skips_the_fsync_and_an_interrupted_one_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: pytest.fail("a cache entry is checked when read"))
    with atomic.replacing(tmp_path / "a.kernel", durable=False, prefix=".0123456789abcdef.") as file:
        names = [p.name for p in tmp_path.iterdir()]
        file.write(b"whole")
    assert len(names) == 1 and names[0].startswith(".0123456789abcdef.") and names[0].endswith(".tmp")
    with pytest.raises(KeyboardInterrupt):
        with atomic.replacing(tmp_path / "a.kernel", durable=False) as file:
            file.write(b"half")
            raise KeyboardInterrupt
    assert [(p.name, p.read_bytes()) for p in tmp_path.iterdir()] == [("a.kernel", b"whole")]


@pytest.mark.parametrize("links", [True, False], ids=["hard-link", "no-hard-links"])
def test_a_new_output_never_replaces_a_file_made_while_it_was_written(tmp_path, monkeypatch, links):
    """Two commands writing one new --out at once: the second refuses, the first's file stays (it was replaced
    by the second's rename); a file system without hard links claims the name with O_EXCL instead."""
    if not links:
        def no_links(*args, **kwargs):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))

        monkeypatch.setattr(atomic.os, "link", no_links)
    path = tmp_path / "model.safetensors"
    with pytest.raises(UserError, match=f"{path} exists \\(another process made it while this one worked\\); add "
                                        "--force to overwrite it"):
        with atomic.atomic_write(path, binary=True, overwrite=False) as file:
            file.write(b"second")
            path.write_bytes(b"first")  # the other process finished meanwhile
    assert path.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no temporary file left
    path.unlink()
    with atomic.atomic_write(path, binary=True, overwrite=False) as file:  # alone, it is written as ever
        file.write(b"only")
    assert path.read_bytes() == b"only" and sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    with atomic.atomic_write(path, binary=True) as file:  # --force: replaced
        file.write(b"forced")
    assert path.read_bytes() == b"forced"


def test_a_link_at_a_new_outputs_name_is_not_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("precious")
    (tmp_path / "out.json").symlink_to(outside)
    with pytest.raises(UserError, match="exists"):
        write_json(tmp_path / "out.json", {"a": 1}, overwrite=False)
    write_json(tmp_path / "out.json", {"a": 1})  # a rename replaces the link itself
    assert outside.read_text() == "precious" and not (tmp_path / "out.json").is_symlink()


@pytest.mark.parametrize("links", [True, False])
def test_a_second_name_of_a_whole_file_replaces_the_old_one_whole(tmp_path, monkeypatch, links):
    """link_whole: `best` made the same file as `last` in one rename (a copy where the file system has no hard
    links); the old `best` stays until then, and a later write of `last` leaves `best` as it was."""
    last, best = tmp_path / "last.npz", tmp_path / "best.npz"
    save_checkpoint(last, {"x": np.arange(3)})
    save_checkpoint(best, {"x": np.zeros(3)})
    if not links:
        def no_links(*args, **kwargs):
            raise OSError(errno.EPERM, "Operation not permitted")
        monkeypatch.setattr(atomic.os, "link", no_links)
    atomic.link_whole(last, best)
    assert last.samefile(best) == links and list(load_checkpoint(best)["x"]) == [0, 1, 2]
    save_checkpoint(last, {"x": np.full(3, 7)})
    assert list(load_checkpoint(best)["x"]) == [0, 1, 2] and list(load_checkpoint(last)["x"]) == [7, 7, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.npz", "last.npz"]


def test_a_second_name_that_cannot_be_made_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch):
    last, best = tmp_path / "last.npz", tmp_path / "best.npz"
    save_checkpoint(last, {"x": np.arange(3)})
    save_checkpoint(best, {"x": np.zeros(3)})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic.os, "replace", full)
    with pytest.raises(UserError, match="best.npz: cannot write it \\(No space left on device\\); the previous file"):
        atomic.link_whole(last, best)
    assert list(load_checkpoint(best)["x"]) == [0, 0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.npz", "last.npz"]


def test_a_file_written_ahead_is_hidden_and_durable_until_committed_over_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "best.npz"
    path.write_bytes(b"old")
    events = []
    real_fsync = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: events.append("fsync") or real_fsync(fd))
    tmp = atomic.write_ahead(path, lambda file: file.write(b"new"))
    assert events == ["fsync"] and tmp.parent == tmp_path and tmp.name.startswith(".best.npz.")
    assert path.read_bytes() == b"old" and tmp.read_bytes() == b"new"
    atomic.commit_ahead(tmp, path)
    assert path.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["best.npz"]


def test_a_file_written_ahead_and_discarded_leaves_the_old_one(tmp_path):
    path = tmp_path / "best.npz"
    path.write_bytes(b"old")
    tmp = atomic.write_ahead(path, lambda file: file.write(b"new"))
    atomic.discard_ahead(tmp)
    atomic.discard_ahead(tmp)  # gone already: nothing to do
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.npz"] and path.read_bytes() == b"old"


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"), ValueError("a bug")])
def test_a_write_ahead_that_fails_leaves_no_temporary_and_names_the_file(tmp_path, error):
    path = tmp_path / "best.npz"

    def write(file):
        file.write(b"part")
        raise error

    with pytest.raises(UserError if isinstance(error, OSError) else ValueError) as raised:
        atomic.write_ahead(path, write)
    if isinstance(error, OSError):
        assert str(raised.value).startswith(f"{path}: cannot write it (No space left on device)")
    assert list(tmp_path.iterdir()) == []


def test_a_commit_that_fails_is_one_line_and_removes_the_file_written_ahead(tmp_path, monkeypatch):
    path = tmp_path / "best.npz"
    tmp = atomic.write_ahead(path, lambda file: file.write(b"new"))

    def refused(a, b):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(atomic.os, "replace", refused)
    with pytest.raises(UserError, match="best.npz: cannot write it \\(Read-only file system\\)"):
        atomic.commit_ahead(tmp, path)
    assert list(tmp_path.iterdir()) == []
