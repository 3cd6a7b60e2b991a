"""What happens between the command and the first step on a GPU: every kernel the run will launch
compiled (or loaded from the disk cache) up front, and what that took, for summary.json.

The launches of a full and of the last (shorter) training window, and of the evaluation batches, are
planned: run through the same code with each launch recorded instead of run
(kernel_cache.kernels.planning). What the cache lacks is compiled by worker processes at once;
everything is then loaded, so no step waits for a compiler and a CUDA graph capture never compiles.
"""

from __future__ import annotations

import time

from mlptrain import STARTED
from mlptrain.training.fallbacks import warn
from mlptrain.training.session import Session
from mlptrain.util.console import console


def plan_launches(s: Session):
    """The kernels (and argument types) a run launches, recorded without running them."""
    # here and below, not at the top: a CPU run never loads the kernel cache
    from mlptrain.backends.kernel_cache import kernels

    window, eval_batch = s.config.train.effective_batch_size, s.config.train.eval_batch_size
    last_window = s.train.size - (s.steps_per_epoch - 1) * window
    with kernels.planning() as plan:
        for rows in sorted({min(window, s.train.size), last_window} - {0}):
            s.window.plan(rows)
        for split in (s.val, s.test):
            # a full batch, the split's last batch and the reconstruction grid's eight images
            for rows in sorted({min(eval_batch, split.size), split.size % eval_batch, min(8, split.size)} - {0}):
                s.evaluator.launch_batch(split, 0, rows)
    return plan


def compile_kernels(s: Session) -> dict:
    """On a GPU, make every kernel of the run ready before the first step, with one status line; returns
    the summary fields of startup (`startup_s`: from the process's start to here, imports, CUDA context and
    data included). Nothing to do on the CPU. The runs of a lane group plan the same launches: the first
    makes them ready for all (TrainingWindow.kernels_made_ready)."""
    records = {"startup_s": round(time.time() - STARTED, 3)}
    if s.backend.name != "cuda":
        return records
    s.notes.extend(s.window.kernels_made_ready(lambda: _make_ready(s)))
    s.evaluator.kernels_ready = True  # its passes were planned (plan_launches): capturing one loads nothing
    return records


def _make_ready(s: Session) -> list[str]:
    """compile_kernels's work: the plan, its kernels compiled or loaded, one line; returns the fallback notes."""
    from mlptrain.backends.kernel_cache import cache as kernel_cache, kernels  # GPU runs only

    started = time.perf_counter()
    plan = plan_launches(s)
    missing = kernels.missing(plan)
    if missing:
        with console.status(f"compiling {missing} kernels (the first run of them on this GPU)"):
            kernels.compile_ahead(plan)
    else:
        kernels.compile_ahead(plan)
    stats = kernel_cache.STATS
    compiled = stats.compiled + stats.compiled_ahead
    console.print(f"{len(plan)} kernels ready in {time.perf_counter() - started:.1f} s: {compiled} compiled"
                  f"{f' by {stats.workers} processes' if stats.workers else ''}, "
                  f"{stats.from_cache + stats.from_index - stats.compiled_ahead} from the cache")
    notes = []
    if stats.parallel_error:  # kernel_cache printed the line
        notes.append(f"compiling kernels in parallel failed ({stats.parallel_error}); compiled one by one")
    if not kernel_cache.store().writable:
        notes.append("the kernel cache is off or cannot be written: kernels compiled in memory for this run")
    note = tensor_core_note(s)
    if note:
        notes.append(warn(note))
    return notes


def tensor_core_note(s: Session) -> str | None:
    """The fallback line of 16-bit convolution passes that run on CUDA cores (an older GPU, channels that
    do not pair up); None when there are none."""
    if s.config.train.precision == "fp32":
        return None
    plan = s.model.kernel_plan(s.config.train.batch_size)
    missed = [f"{layer} {p}" for layer, passes in plan.items() if layer.startswith("conv")
              for p, variant in passes.items() if variant.startswith("tiled")]
    if not missed:
        return None
    return (f"{s.config.train.precision} convolution passes on CUDA cores, not tensor cores ({', '.join(missed)}): "
            "they need compute capability 8.0 and an even channel count")


def kernel_records(s: Session) -> dict:
    """summary.json's kernel fields: compile_s, kernels_compiled, kernels_from_cache (this process, ahead and
    during the run), first_step_s, the kernel cache's own counts (`kernel_cache`, which `write_last_run` records
    for `mlptrain cache info`), `kernel_plan`: the variant each layer's passes ran, and `early_launch`: whether
    kernels were launched before the one ahead of them ended (numba_kernels.grid_order), and `beside_launch`: whether
    some ran beside the launches after them on a second stream (CudaBackend.beside)."""
    first = s.window.first_step_at
    records = {"first_step_s": None if first is None else round(first - STARTED, 3),
               "kernel_plan": s.model.kernel_plan(s.config.train.batch_size)}
    if s.backend.name != "cuda":
        return records
    from mlptrain.backends.kernel_cache import cache as kernel_cache, kernels  # GPU runs only

    stats = kernel_cache.STATS.as_dict()
    return {**records, "early_launch": kernels.early_launches(), "beside_launch": s.backend.launched_beside,
            "compile_s": round(stats["compile_s"] + stats["ahead_s"], 3),
            "kernels_compiled": stats["compiled"] + stats["compiled_ahead"],
            "kernels_from_cache": stats["from_cache"] + stats["from_index"] - stats["compiled_ahead"],
            "kernel_cache": stats}


def write_last_run(records: dict, run: str) -> None:
    """The kernel cache's counts of `kernel_records` (a GPU run's), kept by the cache as this process's last run."""
    if "kernel_cache" not in records:
        return
    from mlptrain.backends.kernel_cache import cache as kernel_cache  # GPU runs only

    kernel_cache.store().write_last_run({"run": run, "at": time.strftime("%Y-%m-%d %H:%M:%S"),
                                         **records["kernel_cache"]})
