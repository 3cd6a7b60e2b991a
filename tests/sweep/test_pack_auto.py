"""`--pack auto` (mlptrain.packing.auto): K doubles while it gains, the answer is cached per GPU and
shape, the CPU packs 1, and the measurement itself runs real sessions side by side (here on the CPU backend;
on the GPU in the real-GPU case, through `mlptrain run --seeds --pack auto`)."""

import json
import os
import subprocess
import sys

import pytest

from mlptrain.config.load import config_from_dict
from mlptrain.errors import OutOfMemory, UserError
from mlptrain.packing import auto as pack_auto
from mlptrain.training.experiment import Resources
from mlptrain.packing.side_by_side import check_pack
from tests.cli.test_cli import REPO

TINY = {"data": {"dataset": "mnist", "val_size": 100}, "model": {"type": "mlp", "hidden": [16]},
        "train": {"batch_size": 32, "epochs": 1}, "backend": "cpu"}


def test_pack_takes_a_count_or_auto():
    assert check_pack("auto") == "auto" and check_pack(" 8 ") == 8 and check_pack(3) == 3
    for bad, said in (("0", "must be in"), ("65", "must be in"), ("two", "must be a number of runs")):
        with pytest.raises(UserError, match=f"--pack {bad}: {said}"):
            check_pack(bad)


def rates_from(table, out_of_memory_at=None):
    """A stand-in for pack_auto._rate: steps a second from `table`; OutOfMemory from `out_of_memory_at` runs."""
    asked = []

    def rate(config, resources, k):
        asked.append(k)
        if out_of_memory_at is not None and k >= out_of_memory_at:
            raise OutOfMemory(f"{k} runs do not fit")
        return table.get(k)

    return rate, asked


@pytest.mark.parametrize("table, out_of_memory_at, k, asked", [
    ({1: 100, 2: 190, 4: 330, 8: 350, 16: 500}, None, 16, [1, 2, 4, 8, 16, 32]),  # 8 adds 6%, 16 then 43%
    ({1: 8522, 2: 9205, 4: 15000, 8: 22000, 16: 26000}, None, 16, [1, 2, 4, 8, 16, 32]),  # lanes: 2 gain 8%
    ({1: 100, 2: 150, 4: 200, 8: 205, 16: 207}, None, 4, [1, 2, 4, 8, 16, 32]),  # 4 is within 10% of the best
    ({1: 100, 2: 105}, None, 1, [1, 2, 4]),
    ({1: 100, 2: 200, 4: 400}, 4, 2, [1, 2, 4]),  # 4 runs do not fit
    ({1: 100}, 1, 1, [1]),  # not even one: the run's own refusal comes when it is built
    ({}, None, 1, [1]),  # no full window to time
])
def test_every_k_that_fits_is_measured_and_the_smallest_near_the_best_chosen(monkeypatch, table, out_of_memory_at,
                                                                              k, asked):
    rate, calls = rates_from(table, out_of_memory_at)
    monkeypatch.setattr(pack_auto, "_rate", rate)
    found, rates = pack_auto.measure(None, None)
    assert (found, calls) == (k, asked)
    assert rates == {runs: table[runs] for runs in calls if runs in table and runs != out_of_memory_at
                     and (out_of_memory_at is None or runs < out_of_memory_at)}


def test_the_measurement_gives_the_thread_its_launch_stream_back(monkeypatch):
    """Each backend the probe makes switches the thread's launch stream to its own; a run packed after the probe
    must queue on its own backend's stream, not a probe session's (the first packed trial's results changed)."""
    from mlptrain.backends.numba_kernels import streams

    def switching(config, resources, k):
        streams.use(f"probe stream {k}")
        return 100.0 * k

    monkeypatch.setattr(pack_auto, "_rate", switching)
    before = streams.current()
    streams.use("the worker's stream")
    try:
        pack_auto.measure(None, None)
        assert streams.current() == "the worker's stream"
    finally:
        streams.use(before)


def test_k_stops_at_the_largest_pack(monkeypatch):
    rate, calls = rates_from({k: 100.0 * k for k in (1, 2, 4, 8, 16, 32, 64, 128)})
    monkeypatch.setattr(pack_auto, "_rate", rate)
    assert pack_auto.measure(None, None)[0] == 64 and calls[-1] == 64


class FakeBackend:
    name, device_name = "cuda", "Fake GPU"


class FakeResources:
    def prepare(self, config):
        return FakeBackend(), None


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(pack_auto.CACHE_ENV, str(tmp_path / "pack"))
    monkeypatch.setattr(pack_auto, "_known", {})
    return tmp_path / "pack" / "auto.json"


def test_the_answer_is_measured_once_and_cached_per_gpu_and_shape(cache, monkeypatch, capsys):
    measured = []
    monkeypatch.setattr(pack_auto, "measure",
                        lambda config, resources, largest=None: measured.append(1) or (8, {1: 10.0, 8: 40.0}))
    config = config_from_dict({**TINY, "backend": "cuda"})
    assert pack_auto.resolve("auto", config, FakeResources(), most=100) == 8
    assert pack_auto.resolve("auto", config, FakeResources(), most=3) == 3  # never more than the runs there are
    monkeypatch.setattr(pack_auto, "_known", {})  # another process: the cache file answers
    assert pack_auto.resolve("auto", config, FakeResources(), most=100) == 8 and measured == [1]
    entries = json.loads(cache.read_text())
    assert [entry["k"] for entry in entries.values()] == [8]
    wider = config_from_dict({**TINY, "backend": "cuda", "model": {"type": "mlp", "hidden": [32]}})
    other = config_from_dict({**TINY, "backend": "cuda", "optim": {"lr": 0.5}, "seed": 3})
    assert pack_auto.cost_key(wider, "Fake GPU") != pack_auto.cost_key(config, "Fake GPU")
    assert pack_auto.cost_key(other, "Fake GPU") == pack_auto.cost_key(config, "Fake GPU")  # lr, seed: same cost
    assert pack_auto.cost_key(config, "Other GPU") != pack_auto.cost_key(config, "Fake GPU")
    said = capsys.readouterr().err
    assert "--pack auto: 8 packed on Fake GPU" in said and "measured" in said and "cached" in said


def test_the_search_stops_at_the_runs_there_are_and_a_larger_sweep_measures_further(cache, monkeypatch):
    asked = []

    def measure(config, resources, largest=None):  # still gaining at every K it may try
        asked.append(largest)
        rates = {k: 10.0 * k for k in (1, 2, 4, 8, 16, 32, 64) if k <= largest}
        return max(rates), rates

    monkeypatch.setattr(pack_auto, "measure", measure)
    config = config_from_dict({**TINY, "backend": "cuda"})
    assert pack_auto.resolve("auto", config, FakeResources(), most=5) == 5 and asked == [8]  # 16, 32, 64 not tried
    assert pack_auto.resolve("auto", config, FakeResources(), most=8) == 8 and asked == [8]  # answered by 8's
    assert pack_auto.resolve("auto", config, FakeResources(), most=20) == 20 and asked == [8, 32]
    asked.clear()

    def two_fit(config, resources, largest=None):
        asked.append(largest)
        return 2, {1: 1.0, 2: 1.9}

    monkeypatch.setattr(pack_auto, "measure", two_fit)
    other = config_from_dict({**TINY, "backend": "cuda", "model": {"type": "mlp", "hidden": [32]}})
    assert pack_auto.resolve("auto", other, FakeResources(), most=3) == 2
    assert pack_auto.resolve("auto", other, FakeResources(), most=60) == 2 and asked == [4]  # 4 did not fit


def test_an_unreadable_cache_is_measured_again_and_off_measures_every_time(cache, monkeypatch):
    measured = []
    monkeypatch.setattr(pack_auto, "measure",
                        lambda config, resources, largest=None: measured.append(1) or (2, {1: 1.0, 2: 2.0}))
    config = config_from_dict({**TINY, "backend": "cuda"})
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    assert pack_auto.resolve("auto", config, FakeResources(), most=10) == 2 and measured == [1]
    monkeypatch.setenv(pack_auto.CACHE_ENV, "off")
    monkeypatch.setattr(pack_auto, "_known", {})
    assert pack_auto.resolve("auto", config, FakeResources(), most=10) == 2 and measured == [1, 1]


def test_the_cpu_packs_one(capsys):
    assert pack_auto.resolve("auto", config_from_dict(TINY), Resources(), most=10) == 1
    assert pack_auto.resolve(5, config_from_dict(TINY), Resources(), most=10) == 5
    assert "--pack auto: 1 on the CPU" in capsys.readouterr().err


def test_the_measurement_steps_real_sessions_side_by_side(tiny_mnist):
    """_rate builds k sessions and times their full windows in turn (the CPU backend: the same calls)."""
    resources = Resources()
    rates = [pack_auto._rate(config_from_dict(TINY), resources, k) for k in (1, 2)]
    assert all(rate > 0 for rate in rates)


@pytest.mark.real_gpu
def test_seeds_packed_auto_on_the_gpu(tmp_path, data_dir):
    """`run --seeds 3 --pack auto` measures K on the GPU once (then reads it from the cache) and trains every seed:
    the same bits both times (after the probe too), and each seed's metrics within float32 rounding of its run
    with --pack 1 (in lanes, a seed's GEMMs sum in another order: tests/training/test_lanes.py)."""
    env = {**os.environ, "MLPTRAIN_DATA_DIR": str(data_dir), pack_auto.CACHE_ENV: str(tmp_path / "cache")}
    command = [sys.executable, "-m", "mlptrain", "run", "adam_mnist", "backend=cuda", "train.epochs=1",
               "model.hidden=[64]", "--seeds", "3", "--runs-dir", str(tmp_path / "runs")]
    metrics = {}
    for name, said, pack in (("first", "measuring", "auto"), ("second", "cached", "auto"), ("alone", None, "1")):
        done = subprocess.run([*command, "--pack", pack, "--name", name], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert said is None or ("--pack auto:" in done.stderr and said in done.stderr), done.stderr
        record = json.loads((tmp_path / "runs" / name / "seeds.json").read_text())
        assert record["seeds"] == [0, 1, 2]
        metrics[name] = record["metrics"]
    assert metrics["first"] == metrics["second"]  # after the probe too: each seed's own bits
    assert_close_metrics(metrics["first"], metrics["alone"])


def assert_close_metrics(got: dict, want: dict, bound: float = 0.01) -> None:
    """seeds.json's metrics: every seed's value within `bound` of `want`'s (absolute for accuracies, else
    relative)."""
    assert sorted(got) == sorted(want)
    for key, record in want.items():
        for a, b in zip(got[key]["values"], record["values"]):
            assert abs(a - b) <= bound * (1.0 if "acc" in key else max(abs(b), 1e-12)), (key, a, b)


def test_a_cpu_sweep_packed_auto_trains_every_trial(tmp_path, tiny_mnist, capsys):
    from tests.sweep.test_packing import GRID
    from tests.sweep.test_sweep import run_sweep, write_sweep

    results = run_sweep(write_sweep(tmp_path, GRID), tmp_path / "runs", pack="auto")
    assert [t["state"] for t in results["trials"]] == ["complete"] * 4
    said = capsys.readouterr().err
    assert "--pack auto" in said and "1 on the CPU" in said
