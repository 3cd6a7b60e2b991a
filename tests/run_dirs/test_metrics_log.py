"""metrics.jsonl keeps one JSON object per line, also after a crash cut its last line mid-write: `run --resume`
appended its next record onto the cut one, and the file's last record no longer read."""

import json

import numpy as np
import pytest

from mlptrain.errors import UserError
from mlptrain.run_dirs.records import RunLogger, is_evaluation_record, read_metrics
from tests.cli.test_cli import assert_clean_failure, mlptrain

FIRST = '{"epoch": 1, "step": 4, "val_loss": 0.5, "test_acc": 0.8}\n'


def append_record(run_dir, record):
    logger = RunLogger(run_dir)
    logger.evaluation(record)
    logger.close()


def assert_one_object_per_line(path):
    text = path.read_text()
    assert text.endswith("\n")
    assert all(isinstance(json.loads(line), dict) for line in text.splitlines())


@pytest.mark.parametrize("cut, kept", [('{"epoch": 2, "step": 8, "val_lo', 1), ('{"epoch": 2, "step": 8}', 2)],
                         ids=["mid-record", "before-its-newline"])
def test_a_cut_last_line_is_mended_before_the_next_record(tmp_path, capsys, cut, kept):
    (tmp_path / "metrics.jsonl").write_text(FIRST + cut)
    append_record(tmp_path, {"epoch": 3, "step": 12, "val_loss": 0.4})
    assert_one_object_per_line(tmp_path / "metrics.jsonl")
    assert [r["epoch"] for r in read_metrics(tmp_path)] == [1, *([2] if kept == 2 else []), 3]
    warned = "its last line was cut mid-write" in capsys.readouterr().err
    assert warned == (kept == 1)  # a record cut only before its newline loses nothing: nothing to say
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 1 + kept + 1  # the header and each record


@pytest.mark.parametrize("content", ["", FIRST])
def test_a_whole_file_is_appended_to_as_it_is(tmp_path, content):
    if content:
        (tmp_path / "metrics.jsonl").write_text(content)
    append_record(tmp_path, {"epoch": 2, "step": 8})
    assert (tmp_path / "metrics.jsonl").read_text() == content + '{"epoch": 2, "step": 8}\n'


@pytest.mark.parametrize("line", ["garbage", '{"epoch": 1', "[1, 2]", "\udcff"])
def test_a_damaged_line_before_the_last_is_refused_and_left_alone(tmp_path, line):
    damaged = FIRST + line + "\n" + FIRST
    (tmp_path / "metrics.jsonl").write_bytes(damaged.encode("utf-8", "surrogateescape"))
    with pytest.raises(UserError, match="metrics.jsonl: line 2 is not a JSON object .*remove or mend that line"):
        RunLogger(tmp_path)
    assert (tmp_path / "metrics.jsonl").read_bytes() == damaged.encode("utf-8", "surrogateescape")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no event file either


@pytest.mark.parametrize("record, taken", [
    ({"epoch": 2, "step": 8, "val_loss": 0.3, "test_acc": None}, True),
    ({"epoch": 2, "step": 8, "test_acc": 10**400}, False),  # it became summary.json's test_acc
    ({"epoch": 2, "step": 8, "test_acc": "0.9"}, False),
    ({"epoch": 2, "step": 8, "run": "another"}, False),  # it would have replaced the summary's run name
    ({"epoch": True, "step": 8}, False),
])
def test_only_an_evaluation_record_stands_for_a_lost_evaluation(record, taken):
    assert is_evaluation_record(record) == taken


def test_resume_after_a_cut_line_and_refusal_of_a_damaged_one(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 6)).astype(np.float32), np.arange(96) % 3
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x[:24], y_test=y[:24])
    args = ["adam_mnist", "backend=cpu", "data.dataset=npz", f"data.path={tmp_path / 'd.npz'}", "data.val_size=24",
            "model.hidden=[8]", "train.batch_size=24", "train.epochs=1", "--name", "r", "--runs-dir", "runs"]
    assert mlptrain("run", *args, cwd=tmp_path).returncode == 0
    metrics = tmp_path / "runs" / "r" / "metrics.jsonl"
    cut = '{"epoch": 2, "step": 6, "train_loss": 1.0'  # killed while writing epoch 2's record
    with metrics.open("a") as file:
        file.write(cut)

    result = mlptrain("run", "--resume", "runs/r", "train.epochs=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"runs/r/metrics.jsonl: its last line was cut mid-write ({len(cut)} bytes, no whole record)" in result.stderr
    assert_one_object_per_line(metrics)
    assert [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()] == [1, 2]

    lines = metrics.read_text().splitlines()
    metrics.write_text(lines[0][:-1] + "\n" + lines[1] + "\n")  # epoch 1's record lost its closing brace
    config = (tmp_path / "runs" / "r" / "config.yaml").read_text()
    result = mlptrain("run", "--resume", "runs/r", "train.epochs=3", cwd=tmp_path)
    assert_clean_failure(result, "runs/r/metrics.jsonl: line 1 is not a JSON object")
    assert (tmp_path / "runs" / "r" / "config.yaml").read_text() == config  # refused before anything is written
