"""A classifier's confusion matrix at each evaluation: counted from the loss kernel's outcomes, drawn, and
logged to TensorBoard beside training."""

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mlptrain.backends.cpu import CpuBackend
from mlptrain.training import confusion
from mlptrain.training.confusion import BLUE, MAX_SIDE, WHITE, OutcomeCounts, confusion_image, confusion_matrix
from mlptrain.training.loop import train
from mlptrain.training.session import build_session
from tests.training.test_accumulation import make_config, synthetic_dataset
from tests.training.test_resume import new_run


def test_the_matrix_counts_true_rows_and_predicted_columns():
    labels, predicted = np.array([0, 0, 1, 2, 2, 2, 7]), np.array([0, 1, 1, 2, 0, 2, 1])
    matrix = confusion_matrix(labels, predicted, 3)  # label 7 is no class: left out
    np.testing.assert_array_equal(matrix, [[1, 1, 0], [0, 1, 0], [1, 0, 2]])


@pytest.mark.parametrize("seed", range(8))
def test_counts_from_outcomes_are_confusion_matrix_s(seed):
    """OutcomeCounts (the labels' part done once) counts what confusion_matrix counts, labels and outcomes out of
    range left out alike: a label that is no class, a predicted class past the last or below 0, no rows."""
    rng = np.random.default_rng(seed)
    classes, rows = int(rng.integers(1, 12)), int(rng.integers(0, 400))
    labels = rng.integers(-1 if seed % 2 else 0, classes + (seed % 3 == 0), rows)
    outcomes = np.where(rng.random(rows) < 0.6, 1, -1 - rng.integers(0, classes + (seed % 4 == 1), rows))
    if seed >= 4 and rows:
        outcomes[rng.integers(0, rows, 3)] = 0  # -1 - 0: a predicted class of -1, on rows of any label
    outcomes = outcomes.astype(np.int32)
    counts = OutcomeCounts(labels, classes)
    for _ in range(2):  # its labels' part reused
        predicted = np.where(outcomes == 1, labels, -1 - outcomes.astype(np.int64))
        np.testing.assert_array_equal(counts.matrix(outcomes), confusion_matrix(labels, predicted, classes))


def test_the_image_shades_each_cell_by_its_share_of_the_row():
    matrix = np.array([[9, 1], [0, 0]])  # an empty row stays white
    image = confusion_image(matrix)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    colours = {tuple(int(v) for v in pixel) for pixel in image.reshape(-1, 3)}
    for share in (0.9, 0.1):  # the two cells of the first row, each its share of the way from white to blue
        assert tuple(np.round(WHITE + share * (BLUE - WHITE)).astype(int)) in colours, share
    assert (255, 255, 255) in colours  # the empty row
    assert confusion_image(np.ones((100, 100), np.int64)).shape[0] <= 700  # a hundred classes stay a picture


@pytest.mark.parametrize("classes", [1, 2, 21, 45, 256])
def test_any_number_of_classes_draws_within_the_picture(classes):
    matrix = np.arange(classes * classes).reshape(classes, classes) * 997  # counts up to "64k"
    image = confusion_image(matrix)
    assert image.dtype == np.uint8 and image.shape[0] == image.shape[1] <= 2 * MAX_SIDE


def _blended_one_by_one(picture, texts):
    """The texts blended in turn, each over its whole box: what confusion._write must equal."""
    for text, x, y, ink in texts:
        coverage, left, top = confusion._rendered(text)
        y0, x0 = y + top, x + left
        coverage = coverage[max(-y0, 0):, max(-x0, 0):]
        region = picture[max(y0, 0):, max(x0, 0):][:coverage.shape[0], :coverage.shape[1]]
        coverage = coverage[:region.shape[0], :region.shape[1], None]
        region[...] = (region * (1 - coverage) + ink * coverage).round().astype(np.uint8)


@pytest.mark.parametrize("classes", [1, 3, 10, 11, 12, 21, 30])
def test_the_texts_blended_at_once_give_the_picture_of_one_at_a_time(classes, monkeypatch):
    rng = np.random.default_rng(classes)
    for most in (3, 999, 9_999, 123_456):  # one to four characters a count, "123k" the widest
        matrix = rng.integers(0, most + 1, (classes, classes))
        at_once = confusion_image(matrix)
        with monkeypatch.context() as patch:
            patch.setattr(confusion, "_write", _blended_one_by_one)
            np.testing.assert_array_equal(at_once, confusion_image(matrix), err_msg=f"{classes} classes, {most}")


def test_each_evaluation_logs_its_confusion_matrix(tmp_path):
    config = make_config(64, 1, epochs=2)
    run = new_run(tmp_path, "run", config)
    session = build_session(config, CpuBackend(), synthetic_dataset())
    train(session, run)
    images = EventAccumulator(str(run), size_guidance={"images": 0}).Reload()
    steps = {tag: [event.step for event in images.Images(tag)] for tag in images.Tags()["images"]}
    last = session.step.read()["steps"]
    assert steps == {"confusion/val": [last // 2, last], "confusion/test": [last]}


def test_the_matrix_agrees_with_the_accuracy(tmp_path):
    config = make_config(64, 1, epochs=1)
    session = build_session(config, CpuBackend(), synthetic_dataset())
    train(session, new_run(tmp_path, "run", config))
    evaluator = session.evaluator
    metrics = evaluator.metrics("val", session.val)
    matrix = evaluator.confusion["val"]
    labels = synthetic_dataset().train_labels[session.val.index]
    np.testing.assert_array_equal(matrix.sum(axis=1), np.bincount(labels, minlength=len(matrix)))
    assert np.trace(matrix) / matrix.sum() == metrics["val_acc"]
