"""What a run leaves behind: TensorBoard scalars and images, metrics.jsonl and metrics.csv, and JSON records such as
summary.json."""

from __future__ import annotations

import csv
import io
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlptrain.config.safe_yaml import brief_text
from mlptrain.errors import UserError
from mlptrain.run_dirs.drawing import Drawing, png
from mlptrain.run_dirs.event_files import EventFile, event_suffix, summary_class
from mlptrain.util.atomic import write_text
from mlptrain.util.console import warn
from mlptrain.util.read_numbers import finite_float
from mlptrain.util.regular_file import open_regular, read_regular_text


def _json_value(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


SPLITS = ("train", "val", "test")
# a record's metric suffix as TensorBoard groups it
METRIC_NAMES = {"loss": "loss", "acc": "accuracy", "mse": "mse"}


def metric_tag(key: str) -> str:
    """A record's key (`val_acc`, `test_loss`, `train_mse`) as its TensorBoard tag, metric first (`accuracy/val`):
    TensorBoard groups tags by what comes before the slash and sorts the groups by name, so the metrics
    open first (accuracy, loss or mse, then opt and perf) with their training, validation and test curves
    side by side, and HParams' metric columns, sorted by tag, start with them."""
    split, metric = key.split("_", 1)
    return f"{METRIC_NAMES[metric]}/{split}"


class RunLogger:
    """TensorBoard events and metrics.jsonl under the run directory; with `mlflow` (an
    mlptrain.run_dirs.mlflow_log.MlflowLog), the same scalars to MLflow, sent at each evaluation. `named`: the
    run's console lines start with its folder's name (`line`), as where several runs print at once.
    `draw_apart`: `image_later`'s images are drawn in a process of their own (mlptrain.run_dirs.drawing);
    `on_fallback` gets the warning line if they cannot be."""

    def __init__(self, run_dir: Path, mlflow=None, named: bool = False, draw_apart: bool = False,
                 on_fallback=None):
        self.run_dir, self.mlflow, self.named = run_dir, mlflow, named
        path = run_dir / "metrics.jsonl"
        try:  # before the writer, so a refusal leaves no new event file behind
            self._metrics = open_regular(path, "a+", follow=False)  # a FIFO would block the run; a link leads out
        except OSError as err:  # a directory or a FIFO put there, a read-only run folder
            raise UserError(f"{path}: cannot append to it ({err.strerror or err}); it must be a writable "
                            "file (or absent)") from None
        try:
            mend_metrics(self._metrics, path)
        except BaseException:
            self._metrics.close()
            raise
        try:
            self.events = EventFile(run_dir, event_suffix())
        except BaseException:
            self._metrics.close()
            raise
        self._summary = summary_class()
        self._drawing, self._drawn = None, []  # images drawn off the training loop (image_later)
        self.drawing = Drawing(draw_apart, on_fallback)

    def line(self, text: str) -> str:
        """A console line of the run's: `text`, after the run's name where it is `named`."""
        return f"{self.run_dir.name} {text}" if self.named else text

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """`values` (tag: number) at `step`, as one event: what add_scalar writes for each, in one record. A
        packed group's 16 lanes log at every read from the one thread that feeds the GPU, where add_scalar's
        checks and event a value took ~70 µs each (5 values: 365 µs a read against 56 as one event, on the
        2-core dev machine; benchmarks/NOTES.md, issue 30 step 15)."""
        self._add([self._summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()], step)
        if self.mlflow is not None:
            self.mlflow.add(step, values)

    def chart_layout(self, classifies: bool) -> None:
        """TensorBoard's Custom Scalars dashboard: one chart per metric with its training, validation and test
        curves together (the Scalars tab draws each tag alone, grouped by the metric: see metric_tag)."""
        metrics = ("loss", "accuracy") if classifies else ("mse",)
        charts = {metric: ["Multiline", [f"{metric}/{split}" for split in SPLITS]] for metric in metrics}
        # tensorboardX only once a run writes its events; EventFile has imported it without torch
        from tensorboardX.summary import custom_scalars

        self.events.add(custom_scalars({"train, val and test": charts}))

    def image(self, tag: str, image, step: int) -> None:
        """An (H, W, C) image: floats in [0, 1], or uint8; made PNG here, and written after the images given to
        `image_later` before it (the event file holds the images in the order given)."""
        made = png(lambda: image)
        if self._drawing is None:
            self._image(tag, made, step)
        else:
            self._later(lambda: self._image(tag, made, step))

    def image_later(self, tag: str, draw, step: int) -> None:
        """`image(tag, draw(), step)` on a thread of the logger's own, in order: drawing and compressing an image
        takes milliseconds that the training loop, which mostly waits on the device or on NumPy, need not
        spend; `close` waits for them. Drawn apart (`draw_apart`), `draw` is pickled to a drawing process: a
        function of its module's with its arguments (functools.partial), not a lambda."""
        made = self.drawing.png_later(draw)
        self._later(lambda: self._image(tag, self.drawing.png_of(made, draw), step))

    def _image(self, tag: str, made: tuple, step: int) -> None:
        """The event of an image made PNG (drawing.png), as tensorboardX's add_image writes it."""
        height, width, channels, data = made
        image = self._summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=data)
        self._add([self._summary.Value(tag=tag, image=image)], step)

    def _add(self, values: list, step: int) -> None:
        """One event of Summary `values` at `step`, written as the writer's add_* methods write theirs."""
        self.events.add(self._summary(value=values), step)

    def _later(self, job) -> None:
        """`job()` on the logger's own thread, after the jobs given before it; `close` waits for them all and
        raises the first one's error."""
        if self._drawing is None:
            self._drawing = ThreadPoolExecutor(1, thread_name_prefix="run-logger")
        self._drawn.append(self._drawing.submit(job))

    def evaluation(self, record: dict) -> None:
        """One JSON object per evaluation, flushed so a crash keeps every line written; then metrics.csv, the
        same records as a table for a spreadsheet, written afresh from metrics.jsonl (which a resumed run
        appends to) on the logger's thread, so that both hold the same rows once it has written it (`close`
        waits for it)."""
        self._metrics.write(json.dumps({k: _json_value(v) for k, v in record.items()}) + "\n")
        self._metrics.flush()
        # on the logger's thread: 3-4 ms of file system work an evaluation (most of an epoch's end in a packed
        # sweep) that the training loop need not wait for; it reads the lines flushed above
        self._later(lambda: write_metrics_csv(self.run_dir))
        if self.mlflow is not None:
            self.mlflow.flush()

    def close(self) -> None:
        try:
            try:
                if self._drawing is not None:
                    self._drawing.shutdown(wait=True)
                    for image in self._drawn:
                        image.result()  # its exception, if drawing failed
            finally:
                self.events.close()
                self._metrics.close()
                if self.mlflow is not None:
                    self.mlflow.flush()
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


def mend_metrics(file, path: Path) -> None:
    """Make metrics.jsonl, open as `file` (mode "a+"), end with a whole record before anything is appended.
    A crash mid-write (the process killed, the disk full) leaves its last line without a newline, and the
    next record, appended onto it, made one line that is neither: a cut line holding a whole JSON object
    gets its newline, any other is removed (its epoch had no checkpoint yet, so it is trained and recorded
    again), with a warning. A damaged line before the last is no crash's doing: refused, naming it."""
    fd = file.fileno()
    data = _read_all(fd)
    tail = check_metrics_lines(data, path)
    if not tail:
        return
    if _is_json_object(tail):  # cut between the record and its newline
        file.write("\n")
        file.flush()
        return
    os.ftruncate(fd, len(data) - len(tail))
    warn(f"{path}: its last line was cut mid-write ({len(tail):,} bytes, no whole record); removed before appending")


def check_metrics_lines(data: bytes, path: Path) -> bytes:
    """Raise UserError naming the first line of metrics.jsonl's `data`, before its last, that is no JSON
    object; returns what follows the last newline (b"" in a whole file), which a crash may have cut."""
    *lines, tail = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not _is_json_object(line):
            raise UserError(f"{path}: line {number} is not a JSON object ({brief_text(repr(line[:80])[2:-1])}); "
                            "a resumed run appends one record per line to a file of records: remove or mend "
                            "that line")
    return tail


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.pread(fd, 2**20, sum(map(len, chunks))):
        chunks.append(chunk)
    return b"".join(chunks)


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; RecursionError: nested deeply
        return False


def is_evaluation_record(record: dict) -> bool:
    """Whether a record read back from metrics.jsonl is one an evaluation writes: a whole epoch and step,
    then train_*, val_* and test_* metrics, each a finite number or null (NaN as written)."""
    counts = all(type(record.get(key)) is int and record[key] >= 0 for key in ("epoch", "step"))
    metrics = {key: value for key, value in record.items() if key not in ("epoch", "step")}
    return counts and all(key.startswith(("train_", "val_", "test_"))
                          and (value is None or finite_float(value) is not None) for key, value in metrics.items())


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
    # not fsynced (4 ms an evaluation, the host's largest part of an epoch's end in a packed sweep): it is
    # derived from metrics.jsonl, itself flushed but not synced, and still replaced whole or not at all
    write_text(run_dir / "metrics.csv", table.getvalue(), durable=False)


def write_json(path: Path, data: dict, overwrite: bool = True) -> None:
    """Top-level non-finite floats become null (JSON has no NaN); written atomically (mlptrain.util.atomic,
    `overwrite` as there)."""
    write_text(path, json.dumps({k: _json_value(v) for k, v in data.items()}, indent=2) + "\n",
               overwrite=overwrite)

