"""What a sweep shows: its trials as rows, results.json and results.csv, a ranked table, HParams sessions."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

from mlptrain.config.load import load_config
from mlptrain.training.hparams import hparam_values, log_session
from mlptrain.util.atomic import write_text
from mlptrain.util.console import console

STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running", "WAITING": "waiting"}
_ORDER = {"complete": 0, "pruned": 1, "running": 2, "waiting": 3, "failed": 4}


def trial_rows(study, sweep) -> list[dict]:
    """One dict per trial, by number: number, params (dotted names), state, value, run_dir, metrics, error.
    An attempt that stopped without an outcome is left out: the trial queued as its `retry_of` stands for it."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    return [{
        "number": t.number,
        "params": sweep.decode({**t.system_attrs.get("fixed_params", {}), **t.params}),
        "state": STATES[t.state.name],
        "value": t.value if t.state.name in ("COMPLETE", "PRUNED") else None,
        "run_dir": t.user_attrs.get("run_dir"),
        "metrics": t.user_attrs.get("metrics", {}),
        "error": t.user_attrs.get("error"),
    } for t in trials if t.number not in retried]


def ranked(rows: list[dict], direction: str) -> list[dict]:
    """Complete trials best first, then pruned ones (by their last value), running, waiting, failed."""
    sign = -1.0 if direction == "maximize" else 1.0
    return sorted(rows, key=lambda r: (_ORDER[r["state"]], sign * r["value"] if r["value"] is not None else 0.0,
                                       r["number"]))


def best(rows: list[dict], direction: str) -> dict | None:
    top = ranked(rows, direction)
    return top[0] if top and top[0]["state"] == "complete" else None


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def write_results(sweep_dir: Path, sweep, rows: list[dict], durable: bool = True) -> None:
    """results.json and results.csv, from the study's rows. After each trial they are written without an
    fsync (`durable=False`): the study is the durable record, and the sweep's end writes them durably."""
    top = best(rows, sweep.direction)
    results = {"sweep": sweep_dir.name, "method": sweep.method, "metric": sweep.metric,
               "direction": sweep.direction, "best": top["number"] if top else None, "trials": rows}
    write_text(sweep_dir / "results.json", json.dumps(_plain(results), indent=2) + "\n", durable)
    names = [p.name for p in sweep.parameters]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["number", "state", sweep.metric, *names, "run_dir", "error"])
    for row in rows:
        params = [_csv_value(row["params"].get(n)) for n in names]
        writer.writerow([row["number"], row["state"], _csv_value(row["value"]), *params, row["run_dir"] or "",
                         row["error"] or ""])
    write_text(sweep_dir / "results.csv", out.getvalue(), durable)


def _csv_value(value) -> str:
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict)) else str(value)


def format_metric(value: float) -> str:
    """Four decimals, as `mlptrain run` shows them, unless that would hide a small MSE."""
    return f"{value:.4f}" if value == 0 or abs(value) >= 0.01 else f"{value:.3e}"


def format_params(params: dict) -> str:
    return " ".join(f"{k}={format_value(v)}" for k, v in params.items())


def results_table(rows: list[dict], sweep, title: str) -> Table:
    """The trials ranked by the metric, the best marked (failed trials' messages are in results.json), for a
    terminal. Every text is literal, never rich markup (a parameter's value may hold brackets)."""
    header, cells, top = _ranked_cells(rows, sweep)
    table = Table(title=Text(title))
    for name in header:
        table.add_column(Text(name))
    for i, row in enumerate(cells):
        table.add_row(*(Text(cell) for cell in row), style="bold green" if i == top else None)
    return table


def results_text(rows: list[dict], sweep, title: str) -> str:
    """results_table as the text Rich prints for it, whole, where nothing is styled (a log, a pipe): its rows
    laid out here, ~1 ms where Rich's measuring and rendering of a 16-trial table took ~50 ms at a packed
    sweep's end on the GPU machine (benchmarks/NOTES.md, issue 30 step 25). The same text, tested."""
    header, cells, _ = _ranked_cells(rows, sweep)
    widths = [max(cell_len(cell) for cell in column) for column in zip(header, *cells)]

    def rule(left: str, middle: str, right: str, fill: str) -> str:
        return left + middle.join(fill * (width + 2) for width in widths) + right

    def line(edge: str, row: list[str]) -> str:
        return edge + edge.join(f" {cell}{' ' * (width - cell_len(cell))} " for cell, width in zip(row, widths)) + edge

    above = io.StringIO()  # the title centred (and wrapped) over the table's width, as Rich renders a table's title
    out = Console(file=above, width=sum(widths) + 3 * len(widths) + 1)
    out.print(Segments(out.render(Text(title), out.options.update(justify="center"))), end="")
    return above.getvalue() + "\n".join([rule("┏", "┳", "┓", "━"), line("┃", header), rule("┡", "╇", "┩", "━"),
                                         *(line("│", row) for row in cells), rule("└", "┴", "┘", "─")]) + "\n"


def show_results(rows: list[dict], sweep, title: str) -> None:
    """The ranked table on the console: a terminal gets Rich's at its width (wrapped, the best row coloured); a log or
    a pipe gets it whole, not squeezed into 80 columns, as plain text (`results_text`)."""
    if console.is_terminal:
        console.print(results_table(rows, sweep, title))
    else:
        console.file.write(results_text(rows, sweep, title))
        console.file.flush()


def _ranked_cells(rows: list[dict], sweep) -> tuple[list[str], list[list[str]], int | None]:
    """(the column names, each ranked trial's cells, the best trial's row or None)."""
    names = [p.name for p in sweep.parameters]
    top = best(rows, sweep.direction)
    cells, at = [], None
    for rank, row in enumerate(ranked(rows, sweep.direction), 1):
        value = "" if row["value"] is None else format_metric(row["value"])
        place = "-" if row["state"] != "complete" else f"{rank} best" if row is top else str(rank)
        if row is top:
            at = rank - 1
        cells.append([place, str(row["number"]),
                      *(format_value(row["params"][n]) if n in row["params"] else "" for n in names),
                      value, row["state"], Path(row["run_dir"]).name if row["run_dir"] else ""])
    return ["rank", "trial", *names, sweep.metric, "state", "run"], cells, at


def log_hparams(run_dir: Path) -> None:
    """The HParams session of a run that stopped early (pruned or failed), as a finished run writes its
    own (mlptrain.training.hparams: its metric columns are the run's own scalars, up to where it stopped); the
    values are those of its config.yaml, which records the backend and data folder it used."""
    log_session(run_dir, hparam_values(load_config(run_dir / "config.yaml")))
