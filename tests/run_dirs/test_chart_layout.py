"""TensorBoard's Custom Scalars dashboard shows a metric's training, validation and test curves on one
chart: the layout a run writes into its event file, read back as TensorBoard reads it."""

import numpy as np
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.custom_scalar import layout_pb2

from tests.run_dirs.test_run_safety import trained_run


def layouts(run_dir):
    found = []
    for events in run_dir.glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(events)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "custom_scalars":
                    found.append(layout_pb2.Layout.FromString(value.tensor.string_val[0]))
    return found


def test_a_classifier_charts_loss_and_accuracy_with_train_val_and_test_together(tmp_path):
    run_dir = trained_run(tmp_path)
    (layout,) = layouts(run_dir)
    charts = {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}
    assert charts == {"loss": ["loss/train", "loss/val", "loss/test"],
                      "accuracy": ["accuracy/train", "accuracy/val", "accuracy/test"]}
    scalars = {value.tag for events in run_dir.glob("events.out.tfevents.*")
               for event in EventFileLoader(str(events)).Load() for value in event.summary.value}
    assert {tag for tags in charts.values() for tag in tags} <= scalars  # every charted tag is one the run logs


def test_a_read_logs_its_scalars_as_one_event_tensorboard_reads_as_scalars(tmp_path):
    """RunLogger.scalars writes a read's values as one event (not one a value: the packed lanes' host time), each
    a scalar as add_scalar's would be read, non-finite values kept."""
    from mlptrain.run_dirs.event_files import import_tensorboardx
    from mlptrain.run_dirs.records import RunLogger

    logger = RunLogger(tmp_path)
    logger.scalars(7, {"loss/train": 0.25, "opt/grad_norm": float("inf"), "opt/lr": 1e-3})
    logger.close()
    theirs_dir = tmp_path / "theirs"
    with import_tensorboardx().SummaryWriter(logdir=str(theirs_dir)) as writer:
        writer.add_scalar("loss/val", 0.5, 7)  # tensorboardX's own, for comparison
    ours, theirs = [[event for path in folder.glob("events.out.tfevents.*") for event in EventFileLoader(str(path)).Load()
                     if event.summary.value][-1] for folder in (tmp_path, theirs_dir)]
    assert ours.step == theirs.step == 7
    assert [(v.tag, v.tensor.float_val[0]) for v in ours.summary.value] == [
        ("loss/train", 0.25), ("opt/grad_norm", float("inf")), ("opt/lr", float(np.float32(1e-3)))]
    for value in ours.summary.value:
        assert value.metadata.plugin_data.plugin_name == theirs.summary.value[0].metadata.plugin_data.plugin_name
        assert value.tensor.dtype == theirs.summary.value[0].tensor.dtype
