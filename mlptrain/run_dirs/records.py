"""What a run leaves behind: TensorBoard scalars and images, metrics.jsonl, and JSON records such as summary.json."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from mlptrain.errors import UserError
from mlptrain.util.atomic import write_text
from mlptrain.util.regular_file import open_regular


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


class RunLogger:
    """TensorBoard events and metrics.jsonl under the run directory."""

    def __init__(self, run_dir: Path):
        SummaryWriter = summary_writer_class()
        self.run_dir = run_dir
        path = run_dir / "metrics.jsonl"
        try:  # before the writer, so a refusal leaves no new event file behind
            self._metrics = open_regular(path, "a")  # a FIFO there would block the run
        except OSError as err:  # a directory or a FIFO put there, a read-only run folder
            raise UserError(f"{path}: cannot append to it ({err.strerror or err}); it must be a writable "
                            "file (or absent)") from None
        self.writer = SummaryWriter(logdir=str(run_dir), flush_secs=10)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def image(self, tag: str, image, step: int) -> None:
        """An (H, W, C) float image in [0, 1]."""
        self.writer.add_image(tag, image, step, dataformats="HWC")

    def evaluation(self, record: dict) -> None:
        """One JSON object per evaluation, flushed so a crash keeps every line written."""
        self._metrics.write(json.dumps({k: _json_value(v) for k, v in record.items()}) + "\n")
        self._metrics.flush()

    def close(self) -> None:
        try:
            self.writer.close()
            self._metrics.close()
        except OSError as err:  # a full or read-only disk: one line, like every other write
            raise UserError(f"{self.run_dir}: cannot write to it ({err.strerror or err})") from None


def write_json(path: Path, data: dict) -> None:
    """Top-level non-finite floats become null (JSON has no NaN); written atomically."""
    write_text(path, json.dumps({k: _json_value(v) for k, v in data.items()}, indent=2) + "\n")

