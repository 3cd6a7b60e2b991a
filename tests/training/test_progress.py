"""The training progress line: this epoch's steps, the run's samples/s (the summary's), a steady ETA, and at any width
the epoch, the step count, the elapsed time and the ETA whole."""

import io
import re
import time

import pytest
from rich.console import Console

from mlptrain.training.monitor import TrainingMonitor
from mlptrain.training.progress import training_progress


def rendered(width, **fields):
    console = Console(file=io.StringIO(), width=width)
    progress = training_progress(console)
    values = dict(epoch=10, epochs=10, loss=0.30851, acc=0.91244, rate=302062.0, ends_at=time.monotonic() + 66.5)
    values.update(fields)
    progress.add_task("train", total=4300, completed=4299, **values)
    console.print(progress.get_renderable())
    return console.file.getvalue().rstrip("\n")


@pytest.mark.parametrize("width", [50, 60, 80, 100, 200])
def test_the_line_fits_and_never_cuts_the_counts_or_the_times(width):
    line = rendered(width).rstrip()
    assert "\n" not in line and len(line) < width
    assert line.startswith("epoch 10/10") and "4299/4300" in line and "…" not in line
    assert re.search(r"0:00:00 eta 0:01:0\d$", line)
    if width >= 80:
        assert "loss 0.3085 acc 0.9124 302k samples/s" in line
    if width >= 100:
        assert "━" in line  # the bar takes what is left


def test_before_the_first_read_the_eta_is_unknown_not_dashes():
    line = rendered(80, ends_at=None, loss=None, acc=None, rate=0.0)
    assert line.endswith("eta ?") and "-:--:--" not in line


class Logger:
    def scalars(self, step, values):
        pass


def test_the_monitor_reports_the_runs_rate_and_a_steady_eta(monkeypatch):
    from mlptrain.config.load import config_from_dict

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    config = config_from_dict({"train": {"epochs": 2}})
    with TrainingMonitor(Logger(), config, steps_per_epoch=10, classifies=True) as monitor:
        task = monitor.progress.tasks[0]
        for step, seconds, samples in ((5, 5.0, 500), (10, 1.0, 500)):  # a slow first window (compilation)
            clock[0] += seconds
            monitor({"epoch": 1, "step_in_epoch": step, "step": step, "lr": 1e-3, "grad_norm": 1.0, "loss_scale": 1.0,
                     "skipped": 0, "loss": 0.5, "acc": 0.9, "samples": samples, "seconds": seconds})
        # the run's steady pace, the median of its reads (not the last window's 500/s, nor the mean 1000/6
        # that the compiling first window drags down): the figure the summary reports, so there is one
        assert task.fields["rate"] == pytest.approx(300.0) == monitor.throughput()["samples_per_s"]
        assert task.completed == 10 and task.total == 10 and task.fields["epoch"] == 1
        # 6 s for 10 of 20 steps: 6 s to go, from the run's average pace
        assert task.fields["ends_at"] - clock[0] == pytest.approx(6.0)


def test_an_interrupted_run_shows_stopped_not_a_finished_eta():
    line = rendered(80, stopped=True)
    assert line.endswith("stopped") and "eta" not in line


def test_a_stop_between_reads_moves_the_bar_to_the_step_that_ran():
    from mlptrain.config.load import config_from_dict

    config = config_from_dict({"train": {"epochs": 2}})
    try:
        with TrainingMonitor(Logger(), config, steps_per_epoch=430, classifies=True) as monitor:
            monitor.stopped_at(253)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    task = monitor.progress.tasks[0]
    assert task.completed == 253 and task.fields["stopped"]
