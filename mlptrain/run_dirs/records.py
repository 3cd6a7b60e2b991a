"""What a run leaves behind: TensorBoard scalars and images, metrics.jsonl and metrics.csv, and JSON records such as
summary.json."""

from __future__ import annotations

import csv
import io
import json
import math
import secrets
import sys
from pathlib import Path

from mlptrain.errors import UserError
from mlptrain.util.atomic import write_text
from mlptrain.util.regular_file import open_regular, read_regular_text


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summary_writer_class():
    """tensorboardX's SummaryWriter, imported without PyTorch: tensorboardX imports torch whenever it is
    installed, only to accept torch tensors (4.1 of a warm MNIST run's 9 s on the GPU machine), and we
    hand it NumPy. torch is hidden during that one import, unless something already imported it."""
    if "torch" in sys.modules:
        # tensorboardX only once a run writes its events (it may import torch: see summary_writer_class)
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX handles
    try:
        # tensorboardX only once a run writes its events (it may import torch: see summary_writer_class)
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


def event_suffix(suffix: str = "") -> str:
    """The end of a new TensorBoard event file's name. tensorboardX names the file by the second and the host
    and opens it with open(name, "wb"), which follows a link: random digits make the name one nobody could
    have put a link at beforehand, so the events are never written through one."""
    return f".{secrets.token_hex(4)}{suffix}"


class RunLogger:
    """TensorBoard events and metrics.jsonl under the run directory."""

    def __init__(self, run_dir: Path):
        SummaryWriter = summary_writer_class()
        self.run_dir = run_dir
        path = run_dir / "metrics.jsonl"
        try:  # before the writer, so a refusal leaves no new event file behind
            self._metrics = open_regular(path, "a", follow=False)  # a FIFO would block the run; a link leads out
        except OSError as err:  # a directory or a FIFO put there, a read-only run folder
            raise UserError(f"{path}: cannot append to it ({err.strerror or err}); it must be a writable "
                            "file (or absent)") from None
        self.writer = SummaryWriter(logdir=str(run_dir), flush_secs=10, filename_suffix=event_suffix())

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def chart_layout(self, classifies: bool) -> None:
        """TensorBoard's Custom Scalars dashboard: one chart per metric with its training, validation and test
        curves together (the Scalars tab draws each tag alone). Tags stay as they are: train/loss, val/loss,
        ...; this only groups them."""
        charts = {"loss": ["Multiline", ["train/loss", "val/loss", "test/loss"]],
                  "accuracy": ["Multiline", ["train/acc", "val/acc", "test/acc"]]} if classifies else \
            {"mse": ["Multiline", ["train/loss", "val/mse", "test/mse"]]}
        self.writer.add_custom_scalars({"train, val and test": charts})

    def image(self, tag: str, image, step: int) -> None:
        """An (H, W, C) float image in [0, 1]."""
        self.writer.add_image(tag, image, step, dataformats="HWC")

    def evaluation(self, record: dict) -> None:
        """One JSON object per evaluation, flushed so a crash keeps every line written; then metrics.csv, the
        same records as a table for a spreadsheet, written afresh from metrics.jsonl (which a resumed run
        appends to), so that both always hold the same rows."""
        self._metrics.write(json.dumps({k: _json_value(v) for k, v in record.items()}) + "\n")
        self._metrics.flush()
        write_metrics_csv(self.run_dir)

    def close(self) -> None:
        try:
            self.writer.close()
            self._metrics.close()
        except OSError as err:  # a full or read-only disk: one line, like every other write
            raise UserError(f"{self.run_dir}: cannot write to it ({err.strerror or err})") from None


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of metrics.jsonl that read as JSON objects, in order; a damaged line (a crash mid-write,
    RecursionError: nested too deeply) is left out; none when the file cannot be read."""
    try:
        lines = read_regular_text(run_dir / "metrics.jsonl", follow=False).splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def write_metrics_csv(run_dir: Path) -> None:
    """metrics.csv from metrics.jsonl: a row per evaluation, a column per key in the order the keys first
    appear (epoch, step, train_*, val_*, test_*); an absent or null value is an empty cell. A damaged line
    of metrics.jsonl is left out here as everywhere it is read."""
    records = read_metrics(run_dir)
    columns = list(dict.fromkeys(key for record in records for key in record))
    table = io.StringIO()
    writer = csv.writer(table, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow(["" if record.get(key) is None else record[key] for key in columns])
    write_text(run_dir / "metrics.csv", table.getvalue())


def write_json(path: Path, data: dict, overwrite: bool = True) -> None:
    """Top-level non-finite floats become null (JSON has no NaN); written atomically (mlptrain.util.atomic,
    `overwrite` as there)."""
    write_text(path, json.dumps({k: _json_value(v) for k, v in data.items()}, indent=2) + "\n",
               overwrite=overwrite)

