"""A result to report or compare: the final metrics of one run (summary.json) or of several seeds
(seeds.json), read and checked, each metric as its values over the seeds and their spread."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mlptrain.config.safe_yaml import brief_text
from mlptrain.errors import UserError
from mlptrain.run_dirs.links import check_no_links
from mlptrain.seeds.statistics import MAX_VALUE, Spread, spread
from mlptrain.util.read_numbers import finite_float
from mlptrain.util.regular_file import read_regular_text

# the final metrics a run reports, in the order tables show them; accuracy is better higher, the rest lower
FINAL_METRICS = ("test_acc", "test_loss", "val_acc", "val_loss", "test_mse", "val_mse")
HIGHER_IS_BETTER = {"test_acc": True, "val_acc": True}
PLAN = "seeds-plan.json"  # a seed group's seeds and config, written first: `run --resume GROUP` finishes it
MAX_BYTES = 64 * 2**20  # far above any summary (a grad-norm history of a million steps is ~20 MB)


@dataclass(frozen=True)
class Result:
    path: Path
    seeds: tuple[int, ...] | None  # None for a single run whose seed is not recorded
    metrics: dict[str, Spread]
    dataset: dict  # name and split sizes, as summary.json records them

    @property
    def n(self) -> int:
        return len(next(iter(self.metrics.values())).values)


def final_metrics(summary: dict) -> dict[str, float]:
    """The final metrics a summary holds as finite numbers in their range (metric_value); val_* are absent
    with data.val_size 0."""
    values = {key: metric_value(key, summary.get(key)) for key in FINAL_METRICS}
    return {key: value for key, value in values.items() if value is not None}


def metric_value(key: str, value) -> float | None:
    """`value` as a float when it is a finite number within metric `key`'s range (metric_range), else None."""
    number = finite_float(value)
    low, high = metric_range(key)
    return number if number is not None and low <= number <= high else None


def metric_range(key: str) -> tuple[float, float]:
    """An accuracy is 0 to 1; a loss or MSE is 0 or more, and at most statistics.MAX_VALUE, so that no
    mean, spread or interval over it overflows."""
    return (0.0, 1.0) if key.endswith("_acc") else (0.0, MAX_VALUE)


def _described_range(key: str) -> str:
    low, high = metric_range(key)
    return f"from {low:g} to {high:g}"


def read_json(path: Path) -> dict:
    """A JSON object from `path`; raises UserError naming it."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise UserError(f"{path}: {path.stat().st_size:,} bytes, too large for a summary (at most {MAX_BYTES:,})")
        data = json.loads(read_regular_text(path))
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: cannot read it ({err})") from None
    except ValueError as err:  # JSONDecodeError, or a number too long to parse
        raise UserError(f"{path}: not valid JSON ({err})") from None
    except RecursionError:  # json's C decoder recurses per level: "[" * 100000 is a few hundred kB
        raise UserError(f"{path}: not a summary (nested too deeply to read)") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def load_result(path: Path) -> Result:
    """A run directory (its summary.json), a seeds directory (its seeds.json), or either file; raises
    UserError when it is none of them or its content is not what mlptrain writes."""
    if path.is_dir():
        check_no_links(path, "seed group" if (path / "seeds.json").exists() else "run")
        for name in ("seeds.json", "summary.json"):
            if (path / name).is_file():
                return load_result(path / name)
        if (path / PLAN).is_file() or any(path.glob("seed-*/config.yaml")):
            raise UserError(f"{path}: a seed group whose seeds have not all finished (no seeds.json yet); finish "
                            f"it with mlptrain run --resume {path}")
        raise UserError(f"{path}: neither seeds.json nor summary.json here; give a finished run directory or "
                        "the directory of `mlptrain run --seeds`")
    data = read_json(path)
    if path.name == "seeds.json" or "seeds" in data:
        return _seeds_result(path, data)
    return summary_result(path, data)


def summary_result(path: Path, data: dict) -> Result:
    """The Result of the summary `data` read from `path`; raises UserError naming the first final metric
    that is not a finite number in its range (or null), or when there is none."""
    for key in FINAL_METRICS:  # absent or null where the run has none (no validation split); else a number
        value = data.get(key)
        if value is not None and metric_value(key, value) is None:
            raise UserError(f"{path}: {key} is {brief_text(repr(value), 40)}; {key} is a finite number "
                            f"{_described_range(key)} (or null); not a summary.json as mlptrain writes it")
    metrics = final_metrics(data)
    if not metrics:
        raise UserError(f"{path}: no final metric ({', '.join(FINAL_METRICS)}); not a finished run's summary.json")
    return Result(path.parent, None, {k: spread([v]) for k, v in metrics.items()}, _dataset(path, data))


def _seeds_result(path: Path, data: dict) -> Result:
    seeds, metrics = data.get("seeds"), data.get("metrics")
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)):
        raise UserError(f"{path}: 'seeds' must be a non-empty list of integers")
    if not isinstance(metrics, dict) or not metrics:
        raise UserError(f"{path}: 'metrics' must map metric names to their values over the seeds")
    out = {}
    for name, record in metrics.items():
        values = record.get("values") if isinstance(record, dict) else None
        if name not in FINAL_METRICS:
            raise UserError(f"{path}: unknown metric '{name}' (known: {', '.join(FINAL_METRICS)})")
        if not (isinstance(values, list) and len(values) == len(seeds)
                and all(metric_value(name, v) is not None for v in values)):
            raise UserError(f"{path}: metrics.{name}.values must be {len(seeds)} finite numbers "
                            f"{_described_range(name)}, one per seed")
        values = [metric_value(name, v) for v in values]
        out[name] = spread(values)
    return Result(path.parent, tuple(seeds), out, _dataset(path, data))


def _dataset(path: Path, data: dict) -> dict:
    dataset = data.get("dataset")
    if not isinstance(dataset, dict) or not isinstance(dataset.get("name"), str):
        raise UserError(f"{path}: no 'dataset' record (name and split sizes); was it written by mlptrain?")
    return dataset
