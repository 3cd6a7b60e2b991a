"""A run's TensorBoard images made PNG on its logger's thread or in drawing processes of their own (runs training
several at once on a GPU, mlptrain.run_dirs.drawing): the same bytes as tensorboardX's add_image either way, in
their order; a drawing process that cannot start or dies is one warning line, recorded, and the images are
drawn on the logger's thread after all."""

import functools
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

from mlptrain.run_dirs import drawing
from mlptrain.run_dirs.event_files import import_tensorboardx
from mlptrain.run_dirs.records import RunLogger
from mlptrain.training.confusion import confusion_image

MATRIX = np.random.default_rng(0).integers(0, 1000, (10, 10))


def images(run_dir) -> list[tuple[str, int, bytes]]:
    return [(value.tag, event.step, value.image.encoded_image_string)
            for path in sorted(run_dir.glob("events.out.tfevents.*")) for event in LegacyEventFileLoader(str(path)).Load()
            for value in event.summary.value if value.HasField("image")]


def logged(run_dir, apart: bool, notes: list) -> list:
    run_dir.mkdir()
    logger = RunLogger(run_dir, named=True, draw_apart=apart, on_fallback=notes.append)
    for step in range(3):
        logger.image_later("confusion/val", functools.partial(confusion_image, MATRIX + step), step)
    logger.image("reconstructions", np.random.default_rng(1).random((6, 5, 1)), 3)  # grey, floats in [0, 1]
    logger.close()
    return images(run_dir)


def test_images_drawn_apart_are_add_images_bytes_in_order(tmp_path):
    notes = []
    here, apart = logged(tmp_path / "here", False, []), logged(tmp_path / "apart", True, notes)
    assert notes == [] and apart == here
    assert sorted((tag, step) for tag, step, _ in apart) == [("confusion/val", 0), ("confusion/val", 1),
                                                            ("confusion/val", 2), ("reconstructions", 3)]
    assert [step for tag, step, _ in apart if tag == "confusion/val"] == [0, 1, 2]  # in the order given
    (tmp_path / "theirs").mkdir()
    writer = import_tensorboardx().SummaryWriter(logdir=str(tmp_path / "theirs"))
    writer.add_image("confusion/val", confusion_image(MATRIX + 2), 2, dataformats="HWC")
    writer.add_image("reconstructions", np.random.default_rng(1).random((6, 5, 1)), 3, dataformats="HWC")
    writer.close()
    assert sorted(images(tmp_path / "theirs")) == sorted(entry for entry in apart if entry[1] >= 2)


class _Dead:
    """A drawing pool whose process died: submit raises, or its futures fail."""

    def __init__(self, at_submit: bool):
        self.at_submit = at_submit

    def submit(self, fn, *args):
        if self.at_submit:
            raise BrokenProcessPool("a child process terminated abruptly")
        future = Future()
        future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
        return future


@pytest.mark.parametrize("at_submit", [True, False])
def test_a_dead_drawing_process_is_one_line_recorded_and_the_images_are_drawn_here(tmp_path, monkeypatch, capsys,
                                                                                    at_submit):
    monkeypatch.setattr(drawing, "_processes", lambda: _Dead(at_submit))
    notes = []
    assert logged(tmp_path / "apart", True, notes) == logged(tmp_path / "here", False, [])
    assert len(notes) == 1 and "not in a process of their own (BrokenProcessPool" in notes[0]
    assert capsys.readouterr().err.count("warning: logging: TensorBoard images drawn beside") == 1


def test_a_drawing_error_is_the_images_own(tmp_path):
    """An error of the drawing itself (not of its process) is raised where the logger's jobs are waited for, as
    when drawn on the logger's thread."""
    logger = RunLogger(tmp_path, draw_apart=True)
    logger.image_later("confusion/val", functools.partial(confusion_image, np.zeros((2, 3))), 0)  # not square
    with pytest.raises(Exception):
        logger.close()


def test_a_drawing_process_leaves_ctrl_c_to_the_training():
    """Ctrl-C reaches the drawing processes too (one process group): they ignore it, so that it stops the
    training's runs as it does without them and no drawing process dies of it (a fallback)."""
    import signal

    assert drawing._processes().submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN
