"""Seeds: --seeds parsing, the seeds.json record, reading results back, and the compare table's checks and
numbers (synthetic summaries here; tests/cli/test_seeds_cli.py trains real ones)."""

import json
import math

import pytest

from mlptrain.errors import UserError
from mlptrain.seeds.report import check_comparable, compare_table, seeds_table
from mlptrain.seeds.results import final_metrics, load_result
from mlptrain.seeds.runner import MAX_SEED, parse_seeds, seeds_record
from mlptrain.seeds.statistics import spread

MNIST = {"name": "mnist", "train": 55000, "val": 5000, "test": 10000, "subset": False}


def summary(run, **metrics):
    return {"run": run, "dataset": MNIST, "epochs": 1, "wall_s": 3.5, **metrics}


def write_seeds(folder, values, dataset=MNIST, key="test_acc"):
    summaries = [summary(f"seed-{i}", **{key: v, "test_loss": 0.1 + v / 10}) for i, v in enumerate(values)]
    record = seeds_record(list(range(len(values))), summaries)
    record["dataset"] = dataset
    folder.mkdir()
    (folder / "seeds.json").write_text(json.dumps(record))
    return folder


@pytest.mark.parametrize("text, seeds", [("3", [0, 1, 2]), ("0,3,7", [0, 3, 7]), (" 5, 2 ", [5, 2]),
                                         (f"0,{MAX_SEED}", [0, MAX_SEED])])
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text, message", [
    ("1", "a count of seeds must be 2 to 1000"), ("0", "must be 2 to"), ("100000000000", "must be 2 to"),
    ("three", "give a count"), ("1,", "give a count"), ("1,1", "a seed is listed twice"),
    ("0,-3", "each seed must be 0 to"), (f"0,{MAX_SEED + 1}", "each seed must be 0 to"),
])
def test_parse_seeds_refusals(text, message):
    with pytest.raises(UserError, match=message) as err:
        parse_seeds(text)
    assert f"--seeds {text}" in str(err.value)


def test_record_holds_each_metric_every_seed_has():
    summaries = [summary("seed-0", test_acc=0.97, test_loss=0.1, val_acc=float("nan")),
                 summary("seed-4", test_acc=0.98, test_loss=0.08, val_acc=0.9)]
    record = seeds_record([0, 4], summaries)
    assert record["seeds"] == [0, 4] and record["runs"] == ["seed-0", "seed-4"] and record["dataset"] == MNIST
    assert list(record["metrics"]) == ["test_acc", "test_loss"]  # val_acc is not finite for seed 0
    acc = record["metrics"]["test_acc"]
    s = spread([0.97, 0.98])
    assert acc["values"] == [0.97, 0.98] and acc["mean"] == pytest.approx(0.975) and acc["higher_is_better"]
    assert acc["std"] == pytest.approx(s.std) and acc["ci"] == pytest.approx(list(s.interval))
    assert acc["half_width"] == pytest.approx(12.706 * s.std / math.sqrt(2), rel=1e-4)
    assert not record["metrics"]["test_loss"]["higher_is_better"]


def test_final_metrics_skip_what_is_not_a_finite_number():
    assert final_metrics({"test_acc": 0.9, "val_acc": None, "val_loss": float("inf"), "test_loss": True,
                          "test_mse": "0.1"}) == {"test_acc": 0.9}


def test_load_result_from_a_seeds_dir_a_run_dir_and_the_files(tmp_path):
    group = write_seeds(tmp_path / "group", [0.97, 0.98, 0.975])
    result = load_result(group)
    assert result.n == 3 and result.seeds == (0, 1, 2) and result.metrics["test_acc"].mean == pytest.approx(0.975)
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(summary("run", test_acc=0.96, test_loss=0.12, val_acc=None)))
    single = load_result(run / "summary.json")
    assert single.n == 1 and single.seeds is None and set(single.metrics) == {"test_acc", "test_loss"}
    assert load_result(run).path == run


@pytest.mark.parametrize("content, message", [
    ("", "not valid JSON"), ("[1, 2]", "expected a JSON object, got list"),
    ('{"epochs": 3, "dataset": {"name": "mnist"}}', "no final metric"),
    ('{"test_acc": 0.9}', "no 'dataset' record"),
    ('{"seeds": [0, 1], "metrics": {"test_acc": {"values": [0.9]}}, "dataset": {"name": "mnist"}}',
     "metrics.test_acc.values must be 2 finite numbers"),
    ('{"seeds": [0, 1], "metrics": {"test_acc": {"values": [0.9, NaN]}}, "dataset": {"name": "mnist"}}',
     "metrics.test_acc.values must be 2 finite numbers"),
    ('{"seeds": [0, 1], "metrics": {"speed": {"values": [1, 2]}}, "dataset": {"name": "mnist"}}',
     "unknown metric 'speed'"),
    ('{"seeds": "0,1", "metrics": {}, "dataset": {"name": "mnist"}}', "'seeds' must be a non-empty list"),
    ('{"seeds": [0, 1], "metrics": [], "dataset": {"name": "mnist"}}', "'metrics' must map"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # json's decoder raised RecursionError: a traceback
])
def test_load_result_refuses_what_mlptrain_does_not_write(tmp_path, content, message):
    path = tmp_path / ("seeds.json" if "seeds" in content else "summary.json")
    path.write_text(content)
    with pytest.raises(UserError, match=message):
        load_result(path)


def test_load_result_refuses_a_folder_without_results(tmp_path):
    with pytest.raises(UserError, match="neither seeds.json nor summary.json"):
        load_result(tmp_path)
    with pytest.raises(UserError, match="no such file"):
        load_result(tmp_path / "missing.json")


def test_compare_refuses_mismatched_results(tmp_path):
    acc = load_result(write_seeds(tmp_path / "acc", [0.97, 0.98]))
    mse = load_result(write_seeds(tmp_path / "mse", [0.004, 0.005], key="test_mse"))
    with pytest.raises(UserError, match="report different metrics") as err:
        check_comparable([acc, mse])
    assert "\n" not in str(err.value)
    other = load_result(write_seeds(tmp_path / "fashion", [0.88, 0.89], dataset={**MNIST, "name": "fashion_mnist"}))
    with pytest.raises(UserError, match="measured on dataset fashion_mnist .10000 test images. and"):
        check_comparable([acc, other])


def render(table):
    from rich.console import Console
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_compare_table_says_which_is_better_only_when_the_interval_excludes_zero(tmp_path):
    a = load_result(write_seeds(tmp_path / "a", [0.9700, 0.9710, 0.9705]))
    b = load_result(write_seeds(tmp_path / "b", [0.9800, 0.9810, 0.9790]))
    c = load_result(write_seeds(tmp_path / "c", [0.9600, 0.9800, 0.9700]))
    text = render(compare_table([a, b, c]))
    assert "B better" in text and "not significant" in text
    # the loss is lower-is-better: B's higher loss (0.1 + acc / 10 here) is worse
    assert "B worse" in text
    # Welch by hand: se^2 = 0.0005^2 / 3 + 0.001^2 / 3, df = 2.94, t(0.975, 2.94) = 3.21: 0.0095 +- 0.0021
    assert "+0.0095 ± 0.0021" in text


def test_seeds_table_shows_every_seed(tmp_path):
    result = load_result(write_seeds(tmp_path / "a", [0.9700, 0.9710, 0.9705]))
    text = render(seeds_table([0, 1, 2], result.metrics))
    assert "seed 0" in text and "seed 2" in text and "0.9705" in text and "95% CI" in text


@pytest.mark.parametrize("key, values", [("test_acc", [1e308, -1e308]), ("test_acc", [10**400, 0.5]),
                                         ("test_loss", [1e308, 1e308]), ("test_loss", [-1.0, 0.5]),
                                         ("test_acc", [0.5, 1.0001])])
def test_values_read_back_out_of_range_are_refused_before_any_arithmetic(tmp_path, key, values):
    """[1e308, -1e308] in seeds.json and a 401-digit test_acc in summary.json were OverflowError tracebacks."""
    (tmp_path / "seeds.json").write_text(json.dumps({"seeds": [0, 1], "metrics": {key: {"values": values}},
                                                     "dataset": MNIST}))
    with pytest.raises(UserError, match=f"metrics.{key}.values must be 2 finite numbers from 0 to "):
        load_result(tmp_path / "seeds.json")
    (tmp_path / "summary.json").write_text(json.dumps(summary("run", **{key: values[0]})))
    if not 0 <= values[0] <= (1 if key == "test_acc" else 1e300):
        with pytest.raises(UserError, match=f"summary.json: {key} is .*; {key} is a finite number from 0 to"):
            load_result(tmp_path / "summary.json")
    assert key not in final_metrics({key: values[0]}) or 0 <= values[0] <= 1


def test_the_largest_values_taken_compare_to_finite_numbers(tmp_path):
    a = load_result(write_seeds(tmp_path / "a", [0.5, 0.6], key="test_loss"))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "seeds.json").write_text(json.dumps({
        "seeds": [0, 1], "dataset": MNIST, "metrics": {"test_loss": {"values": [1e300, 1e-300]}}}))
    b = load_result(tmp_path / "b")
    assert math.isfinite(b.metrics["test_loss"].half_width)
    text = render(compare_table([a, b]))
    assert "inf" not in text and "nan" not in text


def test_finishing_a_group_refuses_a_seed_summary_out_of_range(tmp_path):
    from mlptrain.seeds.finish import finish_group
    from mlptrain.training.experiment import Resources

    group = tmp_path / "group"
    for seed, acc in ((0, 0.9), (1, 10**400)):
        (group / f"seed-{seed}").mkdir(parents=True)
        (group / f"seed-{seed}" / "config.yaml").write_text("seed: 0\n")
        (group / f"seed-{seed}" / "summary.json").write_text(json.dumps(summary(f"seed-{seed}", test_acc=acc)))
    with pytest.raises(UserError, match="seed-1/summary.json: test_acc is 1000"):
        finish_group(group, [], Resources())
    (group / "seed-1" / "summary.json").write_text(json.dumps(summary("seed-1", test_acc=0.92)))
    seeds, record = finish_group(group, [], Resources())
    assert seeds == [0, 1] and record["metrics"]["test_acc"]["values"] == [0.9, 0.92]
