"""summary.json: a run's final metrics, its step counts and throughput, and what actually ran (backend,
device, dataset, CUDA graphs, every fallback). The per-step gradient norms go beside it, to grad_norms.npy.

Fields measured elsewhere (startup and compile timings, the kernel plan, ...) come in as `records`, a
dict merged into the summary as it is: one more field is one more key there.
"""

from __future__ import annotations

import math
import time

from mlptrain.data import dataset_record
from mlptrain.training.evaluation import mean_image_mse
from mlptrain.training.session import Session

GRAD_NORMS = "grad_norms.npy"  # beside summary.json: the pre-clip gradient norm of every optimizer step
DIGITS = 6  # significant digits of summary.json's floats: 0.00503127, 0.9186, 307225.0


def run_summary(s: Session, run_name: str, last: dict, best: float | None, throughput: dict,
                records: dict) -> dict:
    """The summary of a finished run: `last` is its last evaluation record (or the restored best epoch's),
    `best` the best value of the metric that picks the `best` checkpoint, `throughput` the monitor's,
    `records` extra fields. `wall_s` is this process's time (a resumed run's resumed part), `wall_s_total`
    the run's across every process that trained it."""
    t, state = s.config.train, s.step.read()
    wall = time.perf_counter() - s.started
    summary = {
        "run": run_name, "backend": s.backend.name, "device": s.backend.device_name,
        "parameters": s.model.layout.size, "precision": t.precision,
        **{k: v for k, v in last.items() if k != "step"},
        f"best_{s.selection[0]}": best, "selected_by": s.selection[0], "epochs": t.epochs,
        "optimizer_steps": state["steps"], "skipped_steps": state["skipped"],
        "loss_scale": state["loss_scale"] if t.precision == "fp16" else None,
        "batch_size": t.batch_size, "grad_accum_steps": t.grad_accum_steps,
        "effective_batch_size": t.effective_batch_size,
        **throughput,
        "wall_s": wall, "wall_s_total": s.wall_before + wall,
        "grad_norms": GRAD_NORMS,
    }
    if not s.classifies:
        summary["mean_image_mse"] = mean_image_mse(s.dataset)
    summary["dataset"] = dataset_record(s.dataset, s.config.data.val_size)
    summary.update(s.window.graphs_record())
    summary["fallbacks"] = fallbacks(s)
    summary.update(records)
    return rounded(summary)


def rounded(value, digits: int = DIGITS):
    """Floats (also inside lists and dicts) to `digits` significant digits: a measurement keeps its
    precision whatever its size (0.00503127, not 0.0050), and the float noise goes. Whole numbers (a loss
    scale of 2**22) and non-finite values stay as they are."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) and not value.is_integer() else value
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def fallbacks(s: Session) -> list[str]:
    """The warning line of every fallback this run took (see mlptrain.training.fallbacks)."""
    return [*s.fallbacks, *s.notes, *(note for note in (s.window.fallback, s.evaluator.fallback) if note)]
