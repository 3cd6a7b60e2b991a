"""summary.json: a run's final metrics, its step counts and throughput, and what actually ran (backend,
device, dataset, CUDA graphs, every fallback); and the HParams record TensorBoard compares runs by.

Fields measured elsewhere (startup and compile timings, the kernel plan, ...) come in as `records`, a
dict merged into the summary as it is: one more field is one more key there.
"""

from __future__ import annotations

import time

from mlptrain.config import Config, config_to_dict
from mlptrain.data import dataset_record
from mlptrain.evaluation import mean_image_mse
from mlptrain.session import Session


def run_summary(s: Session, run_name: str, last: dict, best: float | None, throughput: dict,
                records: dict) -> dict:
    """The summary of a finished run: `last` is its last evaluation record, `best` the best value of the
    metric that picks the `best` checkpoint, `throughput` the monitor's, `records` extra fields."""
    t, state = s.config.train, s.step.read()
    summary = {
        "run": run_name, "backend": s.backend.name, "device": s.backend.device_name,
        "parameters": s.model.layout.size, "precision": t.precision,
        **{k: v for k, v in last.items() if k != "step"},
        f"best_{s.selection[0]}": best, "epochs": t.epochs,
        "optimizer_steps": state["steps"], "skipped_steps": state["skipped"],
        "loss_scale": state["loss_scale"] if t.precision == "fp16" else None,
        "batch_size": t.batch_size, "grad_accum_steps": t.grad_accum_steps,
        "effective_batch_size": t.effective_batch_size,
        **throughput,
        "wall_s": time.perf_counter() - s.started,
        "grad_norm_history": [float(x) for x in s.step.grad_norm_history(0, state["windows"])],
    }
    if not s.classifies:
        summary["mean_image_mse"] = mean_image_mse(s.dataset)
    summary["dataset"] = dataset_record(s.dataset, s.config.data.val_size)
    summary.update(s.window.graphs_record())
    summary["fallbacks"] = fallbacks(s)
    summary.update(records)
    return summary


def fallbacks(s: Session) -> list[str]:
    """The warning line of every fallback this run took (see mlptrain.fallbacks)."""
    return [*s.fallbacks, *s.notes, *([s.window.fallback] if s.window.fallback else [])]


def hparams(config: Config, summary: dict, classifies: bool) -> tuple[dict, dict]:
    """(hyperparameters, final metrics) for TensorBoard's HParams dashboard."""
    values = {**flat_hparams(config), "train.effective_batch_size": config.train.effective_batch_size}
    finals = ("test_acc", "val_acc", "test_loss", "val_loss") if classifies else ("test_mse", "val_mse")
    return values, {key: summary[key] for key in finals}


def flat_hparams(config: Config) -> dict:
    """Dotted keys to scalar values (lists and None as text), for TensorBoard's HParams dashboard."""
    def flatten(values: dict, prefix: str):
        for key, value in values.items():
            if isinstance(value, dict):
                yield from flatten(value, f"{prefix}{key}.")
            elif key != "description":
                yield prefix + key, str(value) if isinstance(value, (list, type(None))) else value

    return dict(flatten(config_to_dict(config), ""))
