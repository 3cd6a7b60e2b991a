"""TensorBoard's Custom Scalars dashboard shows a metric's training, validation and test curves on one
chart: the layout a run writes into its event file, read back as TensorBoard reads it."""

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
