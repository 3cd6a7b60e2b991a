"""`mlptrain run --seeds` and `mlptrain compare` as a user runs them: real (tiny) MNIST runs on the CPU,
the files and tables they leave, and one-line refusals that write nothing."""

import json

import numpy as np
import pytest
import yaml

from tests.cli.test_cli import assert_clean_failure, mlptrain
from tests.conftest import DATA_DIR

TINY = ["backend=cpu", "train.epochs=1", "model.hidden=[16]", "train.batch_size=512", f"data.root={DATA_DIR}"]


@pytest.fixture(scope="module")
def seeds_run(tmp_path_factory):
    if not (DATA_DIR / "mnist").is_dir():
        pytest.fail(f"real datasets not found at {DATA_DIR} (set MLPTRAIN_DATA_DIR)")
    cwd = tmp_path_factory.mktemp("seeds")
    result = mlptrain("run", "adam_mnist", *TINY, "--seeds", "0,5", "--name", "tiny", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return cwd, cwd / "runs" / "tiny", result.stderr


def test_one_run_per_seed_and_seeds_json(seeds_run):
    _, group, stderr = seeds_run
    assert sorted(p.name for p in group.iterdir()) == ["seed-0", "seed-5", "seeds-plan.json", "seeds.json"]
    assert json.loads((group / "seeds-plan.json").read_text())["seeds"] == [0, 5]
    for seed in (0, 5):
        run = group / f"seed-{seed}"
        assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == seed
        assert (run / "summary.json").is_file() and (run / "checkpoints" / "best.npz").is_file()
    record = json.loads((group / "seeds.json").read_text())
    accs = [json.loads((group / f"seed-{s}" / "summary.json").read_text())["test_acc"] for s in (0, 5)]
    assert record["seeds"] == [0, 5] and record["metrics"]["test_acc"]["values"] == accs
    assert accs[0] != accs[1]  # the seed reaches the initialisation and the data order
    assert set(record["metrics"]) == {"test_acc", "test_loss", "val_acc", "val_loss"}
    assert "seed 0 (1 of 2)" in stderr and "seed 5 (2 of 2)" in stderr
    assert "95% CI" in stderr and "seed 5" in stderr and "seeds.json written to" in stderr


def test_compare_a_seeds_dir_with_one_of_its_runs(seeds_run):
    cwd, group, _ = seeds_run
    result = mlptrain("compare", str(group), str(group / "seed-5"), cwd=cwd)
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert "test_acc" in out and "(1 run)" in out and "1 run: no CI" in out and "B  " in out


def test_compare_a_result_with_itself_finds_no_difference(seeds_run):
    cwd, group, _ = seeds_run
    result = mlptrain("compare", str(group), str(group / "seeds.json"), cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "not significant" in result.stdout + result.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--seeds", "1"], "--seeds 1: a count of seeds must be 2 to 1000"),
    (["--seeds", "a,b"], "--seeds a,b: give a count"),
    (["--seeds", "2", "seed=4"], "--seeds sets each run's seed; drop the seed= override"),
    (["--seeds", "2", "model.init.weights=lecun"], "model.init.weights=lecun: 'lecun' is not one of"),
    (["--seeds", "2", "--name", "../up"], "--name '../up': use letters"),
    (["--seeds", "2", "--pack", "0"], "--pack 0: must be in [1, 64]"),
    (["--seeds", "2", "--pack", "65"], "--pack 65: must be in [1, 64]"),
    (["--pack", "2"], "--pack trains several seeds side by side: give it with --seeds"),
    (["--pack", "auto"], "--pack trains several seeds side by side: give it with --seeds"),
    (["--seeds", "2", "--pack", "many"], "--pack many: must be a number of runs in [1, 64], or auto"),
])
def test_run_seeds_refusals_write_nothing(tmp_path, args, fragment):
    assert_clean_failure(mlptrain("run", "adam_mnist", *TINY, *args, cwd=tmp_path), fragment)
    assert list(tmp_path.iterdir()) == []


def test_seeds_packed_side_by_side_give_the_runs_they_give_one_after_another(seeds_run):
    cwd, group, _ = seeds_run
    result = mlptrain("run", "adam_mnist", *TINY, "--seeds", "0,5", "--pack", "2", "--name", "packed", cwd=cwd)
    assert result.returncode == 0, result.stderr
    packed = cwd / "runs" / "packed"
    alone, together = (json.loads((g / "seeds.json").read_text())["metrics"] for g in (group, packed))
    assert alone == together
    for seed in (0, 5):
        a, b = (np.load(g / f"seed-{seed}" / "checkpoints" / "last.npz") for g in (group, packed))
        for name in a.files:
            if not name.startswith("meta/"):  # wall_s and the like differ; every learned array must not
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_resume_with_seeds_is_refused(tmp_path):
    assert_clean_failure(mlptrain("run", "--resume", "runs/x", "--seeds", "3", cwd=tmp_path), "drop --seeds")


def test_compare_refusals(seeds_run, tmp_path):
    cwd, group, _ = seeds_run
    assert_clean_failure(mlptrain("compare", str(group), cwd=cwd), "compare needs two or more results")
    assert_clean_failure(mlptrain("compare", str(group), str(tmp_path), cwd=cwd),
                         "neither seeds.json nor summary.json here")
    mse = tmp_path / "ae"
    mse.mkdir()
    (mse / "summary.json").write_text(json.dumps({"test_mse": 0.004, "val_mse": 0.0041,
                                                  "dataset": {"name": "cifar10", "test": 1017}}))
    assert_clean_failure(mlptrain("compare", str(group), str(mse), cwd=cwd), "report different metrics")
    # a metric present but no finite number in range: named as such (a 401-digit integer was an OverflowError)
    for value in ('"high"', "Infinity", "NaN", "[0.9]", "9" * 401, "1.5", "-0.1"):
        (mse / "summary.json").write_text(f'{{"test_acc": {value}, "dataset": {{"name": "mnist", "test": 10000}}}}')
        result = mlptrain("compare", str(group), str(mse), cwd=cwd)
        assert_clean_failure(result, "summary.json: test_acc is ")
        assert "test_acc is a finite number from 0 to 1 (or null)" in result.stderr


def test_an_interrupted_group_is_finished_by_resuming_it(seeds_run, tmp_path):
    """A group stopped part-way: seed 0 finished, seed 5 killed after its last checkpoint (no summary), seed
    7 never started. `run --resume GROUP` keeps seed 0, finishes 5, trains 7 and writes seeds.json; before
    that, the original command and compare each say how to finish it."""
    import shutil

    cwd, finished, _ = seeds_run
    group = tmp_path / "runs" / "tiny"
    shutil.copytree(finished, group)
    (group / "seeds.json").unlink()
    (group / "seed-5" / "summary.json").unlink()
    plan = json.loads((group / "seeds-plan.json").read_text())
    (group / "seeds-plan.json").write_text(json.dumps({**plan, "seeds": [0, 5, 7]}))
    kept = (group / "seed-0" / "summary.json").read_text()

    again = mlptrain("run", "adam_mnist", *TINY, "--seeds", "0,5,7", "--name", "tiny", cwd=tmp_path)
    assert_clean_failure(again, f"finish it with mlptrain run --resume {group.relative_to(tmp_path)}")
    assert_clean_failure(mlptrain("compare", str(group), str(finished), cwd=tmp_path),
                         f"finish it with mlptrain run --resume {group}")

    result = mlptrain("run", "--resume", str(group), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    record = json.loads((group / "seeds.json").read_text())
    assert record["seeds"] == [0, 5, 7] and record["runs"] == ["seed-0", "seed-5", "seed-7"]
    assert (group / "seed-0" / "summary.json").read_text() == kept  # a finished seed is not trained again
    assert "seed 0 (" not in result.stderr and "seed 5 (2 of 3)" in result.stderr and "seed 7 (3 of 3)" in result.stderr
    assert yaml.safe_load((group / "seed-7" / "config.yaml").read_text())["seed"] == 7
    resumed = json.loads((group / "seed-5" / "summary.json").read_text())
    original = json.loads((finished / "seed-5" / "summary.json").read_text())
    assert resumed["test_acc"] == original["test_acc"]  # the checkpoint's model, as the killed run left it
    assert_clean_failure(mlptrain("run", "--resume", str(group), cwd=tmp_path), "nothing to resume")
