"""benchmarks/quality.py's own logic on the CPU: the absurd-result checks, the torch_recipes result
line, the per-job statistics and targets, the table, the flag refusals, and both halves end to end
(mlptrain for real on MNIST; PyTorch through a stand-in torch_recipes.py, as the CPU has no torch)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from mlptrain.seeds.statistics import spread, welch
from tests.conftest import DATA_DIR

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quality():
    spec = importlib.util.spec_from_file_location("quality_benchmark", ROOT / "benchmarks" / "quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_value_refuses_absurd_results(quality):
    assert quality.check_value("adam_mnist", 0.9846, "x") == 0.9846
    assert quality.check_value("autoencoder_cifar10", 0.00503, "x") == 0.00503
    for job, value, message in (("adam_mnist", 0.5, "absurd"), ("adam_mnist", 1.2, "absurd"),
                                ("adam_mnist", float("nan"), "not a finite number"),
                                ("adam_mnist", None, "not a finite number"), ("adam_mnist", True, "not a finite"),
                                ("autoencoder_cifar10", 0.07, "absurd"), ("autoencoder_cifar10", 0.0, "absurd")):
        with pytest.raises(quality.Failed, match=message):
            quality.check_value(job, value, "x")
    with pytest.raises(quality.Failed, match="scores 0.0300"):
        quality.check_value("autoencoder_cifar10", 0.031, "x", bound=0.03)


def test_parse_result_reads_the_last_json_line(quality):
    assert quality.parse_result('warming up\n{"test_acc": 0.98}\n\n', "t") == {"test_acc": 0.98}
    for bad in ("", "Traceback ...", "[1, 2]"):
        with pytest.raises(quality.Failed):
            quality.parse_result(bad, "t")


def test_job_report_statistics_and_targets(quality):
    ours, theirs = [0.0041, 0.0043, 0.0042], [0.0039, 0.0040, 0.0038]
    report = quality.job_report("autoencoder_cifar10", {"mlptrain": ours, "pytorch": theirs})
    expected = welch(spread(theirs), spread(ours))
    assert report["mlptrain"]["mean"] == pytest.approx(0.0042)
    assert report["mlptrain"]["half_width"] == pytest.approx(spread(ours).half_width)
    assert report["difference"]["mlptrain_minus_pytorch"] == pytest.approx(0.0003)
    assert report["difference"]["half_width"] == pytest.approx(expected.half_width)
    assert report["targets"] == {"at_least_pytorch": False, "mse_at_most_0.0040": False}
    mnist = quality.job_report("adam_mnist", {"mlptrain": [0.985, 0.986], "pytorch": [0.984, 0.985]})
    assert mnist["targets"] == {"at_least_pytorch": True} and mnist["higher_is_better"]
    lines = "\n".join(quality.table_lines({"adam_mnist": mnist}))
    # each side's std is 0.000707, so se = sqrt(2 * 0.000707^2 / 2) = 0.000707 with df 2: 4.303 * se = 0.0030
    assert "mlptrain - PyTorch: +0.0010 ± 0.0030 (Welch, 95%)" in lines
    assert "target at_least_pytorch: met" in lines and "0.98500 0.98600" in lines


def test_flag_refusals(quality, monkeypatch, capsys):
    for argv in (["--set", "train.epochs=1"], ["--seeds", "1"], ["--jobs", "cifar"], ["--tools", "jax"]):
        monkeypatch.setattr(sys, "argv", ["quality.py", *argv])
        with pytest.raises(SystemExit) as exit_:
            quality.main()
        assert exit_.value.code == 2


def fake_recipes(folder: Path, body: str) -> Path:
    folder.mkdir()
    (folder / "torch_recipes.py").write_text(body)
    return folder


def test_pytorch_half_through_a_stand_in(quality, tmp_path, monkeypatch):
    monkeypatch.setattr(quality, "HERE", fake_recipes(tmp_path / "ok", (
        "import json, sys\nseed = int(sys.argv[sys.argv.index('--seed') + 1])\n"
        "print('noise')\nprint(json.dumps({'test_acc': 0.98 + seed / 1000}))\n")))
    assert quality.pytorch_values("adam_mnist", 3, tmp_path) == pytest.approx([0.98, 0.981, 0.982])
    monkeypatch.setattr(quality, "HERE", fake_recipes(tmp_path / "broken", "raise SystemExit('no GPU')\n"))
    with pytest.raises(quality.Failed, match="PyTorch adam_mnist seed 0 exited 1"):
        quality.pytorch_values("adam_mnist", 2, tmp_path)


def run_main(quality, monkeypatch, tmp_path, *settings):
    monkeypatch.setattr(sys, "argv", ["quality.py", "--data", str(DATA_DIR), "--tools", "mlptrain", "--jobs",
                                      "adam_mnist", "--seeds", "2", "--runs-dir", str(tmp_path / "runs"),
                                      "--json", str(tmp_path / "q.json"), "--set", "backend=cpu",
                                      "--set", "train.epochs=1", *(a for s in settings for a in ("--set", s))])
    return quality.main()


@pytest.mark.slow
def test_mlptrain_half_on_the_cpu(quality, monkeypatch, tmp_path, capsys):
    if not (DATA_DIR / "mnist").is_dir():
        pytest.fail(f"real datasets not found at {DATA_DIR} (set MLPTRAIN_DATA_DIR)")
    assert run_main(quality, monkeypatch, tmp_path, "model.hidden=[128]", "train.batch_size=256") == 0
    report = json.loads((tmp_path / "q.json").read_text())["jobs"]["adam_mnist"]["mlptrain"]
    assert len(report["values"]) == 2 and all(0.9 <= v <= 1 for v in report["values"])
    assert math.isclose(report["mean"], sum(report["values"]) / 2)
    assert "adam_mnist" in capsys.readouterr().out


@pytest.mark.slow
def test_an_absurd_mlptrain_result_fails_loudly(quality, monkeypatch, tmp_path, capsys):
    if not (DATA_DIR / "mnist").is_dir():
        pytest.fail(f"real datasets not found at {DATA_DIR} (set MLPTRAIN_DATA_DIR)")
    # one epoch of a 4-unit MLP stays far below 0.9
    assert run_main(quality, monkeypatch, tmp_path, "model.hidden=[4]", "train.batch_size=1024") == 1
    assert "FAILED: mlptrain adam_mnist seed 0: test accuracy" in capsys.readouterr().err
    assert not (tmp_path / "q.json").exists()
