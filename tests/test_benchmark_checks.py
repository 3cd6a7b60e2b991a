"""The benchmarks' result checks on the CPU (the benchmarks themselves need a GPU and PyTorch): a
convolution pass of benchmarks/conv.py whose output is off by more than its precision's tolerance, or
holds a NaN, stops the script with exit code 1 before anything is timed; benchmarks/mlp_mnist.py
and autoencoder_cifar10.py report no speed of a model whose loss did not fall."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def conv_benchmark():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its neighbour gemm.py
    try:
        spec = importlib.util.spec_from_file_location("conv_benchmark", ROOT / "benchmarks" / "conv.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.mark.parametrize("precision, good, bad", [("fp32", 3e-6, 2e-3), ("bf16", 8e-3, 0.2), ("fp16", 1e-3, 0.05)])
def test_a_result_beyond_its_tolerance_exits_1_before_timing(conv_benchmark, precision, good, bad):
    conv_benchmark.check(good, precision, "16x16 256->128 forward ours")
    conv_benchmark.check(0.0, precision, "exact")
    for error in (bad, float("nan"), float("inf")):
        with pytest.raises(SystemExit) as stop:
            conv_benchmark.check(error, precision, "16x16 256->128 forward ours")
        assert "WRONG RESULT: 16x16 256->128 forward ours" in str(stop.value.code)
        assert f"{precision} tolerance" in str(stop.value.code) and "nothing was timed" in str(stop.value.code)


def test_every_precision_has_a_tolerance_below_a_wrong_kernels_error(conv_benchmark):
    # a wrong kernel (a dropped tap, a swapped channel) is off by order 1 of the output's scale
    assert set(conv_benchmark.TOLERANCE) == {"fp32", "bf16", "fp16"}
    assert all(0 < tol <= 0.05 for tol in conv_benchmark.TOLERANCE.values())


def test_the_mlp_benchmark_reports_no_speed_of_a_model_that_does_not_learn():
    spec = importlib.util.spec_from_file_location("mlp_benchmark", ROOT / "benchmarks" / "mlp_mnist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.check_learning("mlptrain", "fp32", 0.1, module.WARM_UP_LOSS, "after the warm-up epoch")
    for loss in (2.3, float("nan"), float("inf")):
        with pytest.raises(SystemExit, match="WRONG RESULT: mlptrain bf16: training loss"):
            module.check_learning("mlptrain", "bf16", loss, module.WARM_UP_LOSS, "after the warm-up epoch")
    with pytest.raises(SystemExit, match="at the end is not below 1"):
        module.check_learning("pytorch", "fp16", 1.5, module.FINAL_LOSS, "at the end")


def test_the_autoencoder_benchmark_reports_no_speed_of_a_model_that_does_not_learn():
    spec = importlib.util.spec_from_file_location("ae_benchmark", ROOT / "benchmarks" / "autoencoder_cifar10.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.check_learning("mlptrain", 256, "bf16", 0.013, module.FINAL_MSE, "in the last epoch")
    for mse in (0.28, float("nan"), float("inf")):
        with pytest.raises(SystemExit, match="WRONG RESULT: mlptrain batch 256 bf16: training MSE"):
            module.check_learning("mlptrain", 256, "bf16", mse, module.FINAL_MSE, "in the last epoch")
    with pytest.raises(SystemExit, match="after the warm-up epoch"):
        module.check_learning("pytorch", 64, "fp32", float("nan"), float("inf"), "after the warm-up epoch")


def test_the_packed_trials_benchmark_reads_a_sessions_training_loss(rng):
    """benchmarks/packed_trials.py checks each trial's last-epoch training loss through the evaluator's reads;
    a read renamed in the package broke it on the GPU machine once (session 22): here on the CPU."""
    from mlptrain.backends.cpu import CpuBackend
    from mlptrain.config.load import config_from_dict
    from mlptrain.training.loop import train_epoch
    from mlptrain.training.session import build_session
    from tests.training.test_train_backends import tiny_dataset

    spec = importlib.util.spec_from_file_location("packed_benchmark", ROOT / "benchmarks" / "packed_trials.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = config_from_dict({"seed": 3, "data": {"val_size": 7}, "model": {"hidden": [6]},
                               "train": {"batch_size": 8, "log_every": 2}})
    session = build_session(config, CpuBackend(), tiny_dataset(rng))
    reads = []
    train_epoch(session, 1, reads.append)
    mean = sum(r["loss"] * r["samples"] for r in reads) / sum(r["samples"] for r in reads)
    assert abs(module.last_loss(session) - mean) < 1e-9


def test_the_sweep_host_table_counts_each_phases_calls_on_the_cpu(data_dir, tmp_path):
    """benchmarks/sweep_host.py on a tiny packed CPU sweep: it completes the sweep, then puts the sessions in the
    start, the lane group's steps in the training and the last evaluations in the end, on the feeding thread."""
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep_host.py"), "--trials", "2", "--epochs", "1",
                           "--flags", "--pack 2", "--set", "backend=cpu", "--set", "model.hidden=[8]",
                           "--set", "train.batch_size=2048", "--json", str(tmp_path / "host.json")],
                          capture_output=True, text=True, env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| start") or
            line.startswith("| training") or line.startswith("| end")]
    found = {(row[0].strip("| "), row[1], row[2]) for row in rows}
    assert ("start", "session.build_session", "feeding") in found
    assert ("training", "LaneGroup._step", "feeding") in found
    assert ("end", "Evaluator.epoch_record_steps", "feeding") in found
    steps = sum(int(row[3]) for row in rows if row[1] == "LaneGroup._step")
    assert steps == -(-55000 // 2048)  # the epoch's 27 steps (60,000 images less adam_mnist's 5,000 held out)


def test_the_sweep_samples_table_names_what_each_phase_ran_on_the_cpu(data_dir, tmp_path):
    """benchmarks/sweep_samples.py on a tiny packed CPU sweep: it completes the sweep, then names the command's
    own function on the feeding thread in the start and the packed workers' in the end (hundreds of samples each),
    and --json keeps every sample of the run, each at a time within the process."""
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep_samples.py"), "--trials", "2",
                           "--epochs", "1", "--flags", "--pack 2", "--set", "backend=cpu", "--set", "model.hidden=[8]",
                           "--set", "train.batch_size=2048", "--json", str(tmp_path / "samples.json")],
                          capture_output=True, text=True, env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {tuple(cell.strip() for cell in line.split("|")[1:4]) for line in done.stdout.splitlines()
            if line.startswith(("| start", "| end"))}
    assert ("start", "feeding", "mlptrain.cli.sweep:sweep") in rows
    assert ("end", "feeding", "mlptrain.sweep.engine:work_packed") in rows
    run = json.loads((tmp_path / "samples.json").read_text())["runs"][0]
    assert 0 < run["first_step_s"] < run["last_step_s"] < run["end_s"]
    assert all(0 <= now <= run["end_s"] for now, _, _ in run["raw"]["samples"]) and run["raw"]["samples"]


def test_the_epoch_parts_table_times_each_part_of_an_epoch_on_the_cpu(data_dir, tmp_path):
    """benchmarks/epoch_parts.py on the CPU: a run that learns, its epochs' full windows and partial one counted,
    and the order of each timed epoch but the last made once, ahead (training.loop)."""
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "epoch_parts.py"), "--backend", "cpu",
                           "--epochs", "4", "--hidden", "16", "--json", str(tmp_path / "parts.json")],
                          capture_output=True, text=True, env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "parts.json").read_text())
    parts = {name: part["calls"] for name, part in result["parts"].items()}
    assert parts["full windows"] == 55000 // 2048 and parts["partial window"] == 1  # 5,000 of 60,000 held out
    # epochs 3 and 4 timed: epoch 3 made epoch 4's order, epoch 4 none (the last); each copied its own
    assert parts["order (epoch_order)"] == 0.5 and parts["order copied (start_epoch)"] == 1
    assert result["loss"] < 1.0 and "| full windows |" in done.stdout


def test_the_lane_step_table_times_packed_steps_of_lanes_that_learn_on_the_cpu(data_dir, tmp_path):
    """benchmarks/lane_step.py on the CPU: two lanes of the MNIST job, each round's steps timed, every lane's loss
    below its warm windows' (else exit 1); rounds that do not fit in an epoch stop it before anything runs."""
    import subprocess

    def lane_step(*flags):
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lane_step.py"), "--backend", "cpu",
                               "--lanes", "2", *flags], capture_output=True, text=True,
                              env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)})

    done = lane_step("--steps", "3", "--rounds", "2", "--warm", "2", "--json", str(tmp_path / "lanes.json"))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "lanes.json").read_text())
    assert result["lanes"] == 2 and len(result["step_us"]) == 2 and result["engine"] == "fma"
    assert all(last < first for first, last in zip(result["loss_first"], result["loss_last"]))
    assert "| µs a step (median) |" in done.stdout
    too_many = lane_step("--steps", "300", "--rounds", "2")
    assert too_many.returncode == 1 and "must fit in an epoch's 429 windows" in too_many.stderr


def test_the_alternating_variants_each_run_with_their_constants_set(data_dir, tmp_path):
    """benchmarks/alternate.py on the CPU: each variant's round in mlp_mnist.py (which checks the loss) with its
    constants set, one table row per variant; a constant its module lacks stops it before anything is timed."""
    import subprocess

    def alternate(*variants):
        return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "alternate.py"), "--rounds", "1", *variants,
                               "--json", str(tmp_path / "variants.json"), "--", "--backend", "cpu",
                               "--precisions", "fp32", "--epochs", "1", "--hidden", "32", "--batch-size", "1024"],
                              capture_output=True, text=True, env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)})

    done = alternate("base=", "unfused=gemm_narrow.FUSE_INPUT_GRADIENT=False;mlptrain.backends.cuda_devices.BESIDE=0")
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "variants.json").read_text())
    assert set(results) == {"base", "unfused"} and all(len(r["fp32"]) == 1 and r["fp32"][0] > 0
                                                       for r in results.values())
    assert "| unfused | fp32 |" in done.stdout
    typo = alternate("base=", "typo=gemm_narrow.FUSE_INPUT_GRADIANT=False")
    assert typo.returncode != 0 and "has no FUSE_INPUT_GRADIANT" in typo.stderr + typo.stdout


def test_the_sweep_timeline_counts_a_packed_sweeps_steps_and_epochs_on_the_cpu(data_dir, tmp_path):
    """benchmarks/sweep_timeline.py on a tiny packed CPU sweep: it completes the sweep and counts every flush of
    the lane group, its epochs and the host's stalls (no GPU events on the CPU: their columns are "-")."""
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep_timeline.py"), "--trials", "2",
                           "--epochs", "2", "--flags", "--pack 2", "--set", "backend=cpu", "--set", "model.hidden=[8]",
                           "--set", "train.batch_size=2048", "--json", str(tmp_path / "timeline.json")],
                          capture_output=True, text=True, env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = json.loads((tmp_path / "timeline.json").read_text())
    assert run["epochs"] == 2 and run["flushes"] == 2 * -(-55000 // 2048)  # adam_mnist holds 5,000 of 60,000 out
    assert 0 < run["first_flush_s"] < run["last_flush_s"] < run["wall_s"]
    assert "gpu_span_ms" not in run and "| 1 |" in done.stdout


def test_the_sweep_timeline_tells_an_epoch_end_gap_from_a_read_gap():
    """summarise's kinds: a gap after a flush whose lanes ended an epoch, one at a read's step, the rest."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from sweep_timeline import summarise
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    # (host start, host end, lanes ending an epoch, GPU step ms, GPU gap ms before it): two epochs of 4 steps,
    # reads every 2 steps
    flushes = [[0.0, 0.001, 0, 1.0, 0.0], [0.002, 0.003, 0, 1.0, 0.5], [0.004, 0.005, 0, 1.0, 2.0],
               [0.006, 0.007, 2, 1.0, 0.25], [0.050, 0.051, 0, 1.0, 8.0], [0.052, 0.053, 0, 1.0, 0.125],
               [0.054, 0.055, 0, 1.0, 4.0], [0.056, 0.057, 2, 1.0, 1.0]]
    found = summarise(flushes, log_every=2)
    assert found["epochs"] == 2 and found["flushes"] == 8
    assert found["gaps_epoch_ends_ms"] == 8.0 and found["gaps_reads_ms"] == 6.0 and found["gaps_other_ms"] == 1.875
    assert found["steps_ms"] == 8.0 and found["gpu_span_ms"] == 8.0 + 15.875
    assert found["host_stalls"] == 1 and abs(found["host_stall_s"] - 0.043) < 1e-9


def test_the_sweep_against_run_table_times_both_and_checks_them_on_the_cpu(data_dir, tmp_path):
    """benchmarks/sweep_against_run.py on the CPU: a packed sweep of two trials against one run, each timed whole,
    with their summaries' phases; a sweep whose trials did not all complete, or a run that did not learn, stops it
    (exit 1) before anything is printed."""
    import subprocess

    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sweep_against_run.py"), "--trials", "2",
                           "--epochs", "1", "--rounds", "1", "--flags", "--pack 2", "--set", "backend=cpu",
                           "--set", "model.hidden=[32]", "--learned-below", "2.0", "--out", str(tmp_path / "out"),
                           "--json",
                           str(tmp_path / "result.json")],
                          capture_output=True, text=True, env={**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir)})
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["trials"] == 2 and set(result["medians"]) == {"this", "run"} and result["paired"] == {"this": 0.0}
    assert "| sweep this |" in done.stdout and "| run |" in done.stdout and "first_step_s" in done.stdout

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from sweep_against_run import checked_run, checked_sweep
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    sweep = next((tmp_path / "out" / "sweeps").glob("this-0-*"))
    assert len(checked_sweep(sweep, 2, 1.0)) == 2
    with pytest.raises(SystemExit, match="WRONG RESULT"):
        checked_sweep(sweep, 3, 1.0)  # a trial missing
    with pytest.raises(SystemExit, match="no trial learned"):
        checked_sweep(sweep, 2, 0.0)
    run = next((tmp_path / "out" / "runs").glob("run-0-*"))
    assert checked_run(run, 1.0)["train_loss"] < 1.0
    with pytest.raises(SystemExit, match="WRONG RESULT"):
        checked_run(run, 0.0)


def test_sweep_against_run_gives_each_version_a_folder_of_its_package_alone(tmp_path):
    """--versions: each version's mlptrain package copied into a folder of its own (no __pycache__), so that every
    version runs from the same layout; the installed package (no path) stays; a path without the package stops it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from sweep_against_run import staged
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    checkout = tmp_path / "checkout"
    (checkout / "mlptrain" / "__pycache__").mkdir(parents=True)
    (checkout / "mlptrain" / "__init__.py").write_text("VERSION = 'a'\n")
    (checkout / "mlptrain" / "__pycache__" / "x.pyc").write_bytes(b"")
    (checkout / "tests").mkdir()
    versions = staged([("new", str(checkout)), ("this", None)], tmp_path / "versions")
    assert versions == [("new", str(tmp_path / "versions" / "new")), ("this", None)]
    copied = tmp_path / "versions" / "new"
    assert sorted(p.name for p in copied.iterdir()) == ["mlptrain"]
    assert (copied / "mlptrain" / "__init__.py").read_text() == "VERSION = 'a'\n"
    assert not (copied / "mlptrain" / "__pycache__").exists()
    with pytest.raises(SystemExit, match="no mlptrain package there"):
        staged([("bad", str(checkout / "tests"))], tmp_path / "versions")
