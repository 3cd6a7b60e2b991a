"""The tables of `mlptrain run --seeds` and `mlptrain compare`: means with their 95% confidence
intervals, each printed to the two significant digits of its interval's half-width (more would be noise)."""

from __future__ import annotations

from rich.table import Table

from mlptrain.errors import UserError
from mlptrain.seeds.results import FINAL_METRICS, HIGHER_IS_BETTER, Result
from mlptrain.seeds.statistics import Difference, Spread, decimals, welch


def seeds_table(seeds: list[int], metrics: dict[str, Spread]) -> Table:
    """One row per metric: mean, standard deviation, 95% CI, and each seed's value."""
    table = Table("metric", "mean", "std", "95% CI", *(f"seed {seed}" for seed in seeds),
                  title=f"{len(seeds)} seeds: mean, sample std, 95% CI (Student t)")
    for key, s in metrics.items():
        d, e = decimals(s.half_width), decimals(s.std)  # one seed's value is as precise as the spread
        lo, hi = s.interval
        table.add_row(key, f"{s.mean:.{d}f}", f"{s.std:.{e}f}", f"{lo:.{d}f} to {hi:.{d}f}",
                      *(f"{v:.{e}f}" for v in s.values))
    return table


def check_comparable(results: list[Result]) -> None:
    """Refuse results that do not measure the same thing: other metrics, another dataset or test split."""
    first = results[0]
    for other in results[1:]:
        if set(other.metrics) != set(first.metrics):
            only = sorted(set(other.metrics) ^ set(first.metrics), key=FINAL_METRICS.index)
            raise UserError(f"{other.path} and {first.path} report different metrics ({', '.join(only)} in one "
                            "only); compare results of the same kind of model and validation split")
        for key in ("name", "test"):
            if other.dataset.get(key) != first.dataset.get(key):
                raise UserError(f"{other.path} was measured on dataset {_describe(other.dataset)} and {first.path} "
                                f"on {_describe(first.dataset)}; compare results on the same test set")


def _describe(dataset: dict) -> str:
    return f"{dataset.get('name')} ({dataset.get('test')} test images)"


def labels(count: int) -> list[str]:
    return [chr(ord("A") + i) if i < 26 else str(i + 1) for i in range(count)]


def legend(results: list[Result]) -> list[str]:
    """One line per result: its letter, path and number of seeds."""
    return [f"{label}  {result.path}  ({result.n} {'seeds' if result.n > 1 else 'run'})"
            for label, result in zip(labels(len(results)), results)]


def compare_table(results: list[Result]) -> Table:
    """Per metric, each result's mean +- 95% CI and, after the first, its difference from the first with
    Welch's 95% CI and what that says."""
    check_comparable(results)
    names = labels(len(results))
    table = Table("metric", "", "mean ± 95% CI", f"minus {names[0]} ± 95% CI", "",
                  title="means over seeds ± 95% CI (Student t); differences: Welch's t")
    for key in sorted(results[0].metrics, key=FINAL_METRICS.index):
        for i, (label, result) in enumerate(zip(names, results)):
            s = result.metrics[key]
            difference = welch(results[0].metrics[key], s) if i else None
            table.add_row(key if i == 0 else "", label, _mean(s),
                          _difference(difference) if difference else "",
                          _verdict(difference, key, label) if difference else "",
                          end_section=i == len(results) - 1)
    return table


def _mean(s: Spread) -> str:
    if s.half_width is None:
        return f"{s.mean:.4f} (1 run)"
    d = decimals(s.half_width)
    return f"{s.mean:.{d}f} ± {s.half_width:.{d}f}"


def _difference(d: Difference) -> str:
    if d.half_width is None:
        return f"{d.delta:+.4f} (1 run: no CI)"
    digits = decimals(d.half_width)
    return f"{d.delta:+.{digits}f} ± {d.half_width:.{digits}f}"


def _verdict(d: Difference, key: str, label: str) -> str:
    if not d.excludes_zero:
        return "not significant" if d.half_width is not None else ""
    better = (d.delta > 0) == HIGHER_IS_BETTER.get(key, False)
    return f"{label} {'better' if better else 'worse'}"
