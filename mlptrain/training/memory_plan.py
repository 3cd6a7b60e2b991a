"""What a run needs in memory, estimated from its config before anything is allocated or written.

The estimate lays the run's buffers out with the real constructors (model, optimizer state, training
window, evaluator, resident data) on a `CountingBackend`, which records each allocation's bytes and
hands back a zero-stride view instead of memory, so it follows the code as it changes. Per-step records
(the lr table and the grad-norm record on the device; the lr table's construction, the monitor's reads
and summary.json's grad_norm_history on the host) and the host copies made to initialise and
checkpoint the parameters are added by their formulas. A config that does not fit is refused with one
line that says what would: the batch size that fits (with accumulation to keep the effective batch),
a smaller evaluation batch, or which part is too large.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlptrain.backends.counting import CountingBackend
from mlptrain.config.schema import steps_per_epoch
from mlptrain.data.dataset import held_out_rows
from mlptrain.data.loader import resident_splits, train_rows, whole_split
from mlptrain.errors import OutOfMemory, UserError
from mlptrain.nn import make_model
from mlptrain.optim import make_optimizer
from mlptrain.training.evaluation import Evaluator
from mlptrain.training.window import TrainingWindow
from mlptrain.util.host_memory import HEADROOM, binding_limit, gib, host_available

DEVICE_BYTES_PER_STEP = 16  # the lr table and the grad-norm record, float64 each
HOST_BYTES_PER_STEP = 120  # the lr table built through a Python list, grad_norm_history in summary.json
MAX_TOTAL_STEPS = 2**31 - 1  # optimizer steps of a run: the device step counter and every per-step record


@dataclass(frozen=True)
class Need:
    """Bytes a run needs: on its device (the host for the cpu backend) and on the host besides."""

    device: int
    host: int
    per_row_device: int  # what one more row of the largest batch adds on the device


def buffer_rows(config, train_size: int, eval_size: int) -> int:
    """Rows the model's buffers hold: the larger of a micro-batch and an evaluation batch, neither
    larger than its split (a batch beyond the split is never filled)."""
    return max(min(config.train.batch_size, max(train_size, 1)), min(config.train.eval_batch_size, max(eval_size, 1)))


def _device_bytes(config, backend, dataset, rows: int) -> tuple[int, int, int]:
    """(device bytes, parameter count, optimizer steps) of the run's buffers with `rows` batch rows."""
    counting = CountingBackend(backend)
    train, val, test = resident_splits(dataset, counting, config.data.val_size, config.seed)
    model = make_model(config, counting, dataset, rows)
    make_optimizer(config.optim, counting, model.params)
    TrainingWindow(counting, model, None, train, 1.0, 0.0, config.train)
    Evaluator(counting, model, config.train.eval_batch_size, max(val.size, test.size), 1.0, 0.0)
    steps = config.train.epochs * steps_per_epoch(train.size, config.train)
    return counting.bytes + DEVICE_BYTES_PER_STEP * min(steps, MAX_TOTAL_STEPS + 1), model.layout.size, steps


def estimate(config, backend, dataset, device: bool = True) -> tuple[Need, int, int]:
    """(what the run needs, its batch rows, its optimizer steps) for a dataset already passed through
    `nn.model_dataset`. Without `device`, the host's need alone (Need.device and per_row_device 0), from the
    parameters' layout, without laying the run's buffers out (twice)."""
    n = len(dataset.train_images)
    val_size = min(held_out_rows(config.data.val_size, n), n)
    rows = buffer_rows(config, n - val_size, max(val_size, len(dataset.test_images)))
    layout = make_model(config, CountingBackend(backend), dataset, 1).layout
    if device:
        device_bytes, params, steps = _device_bytes(config, backend, dataset, rows)
        more, _, _ = _device_bytes(config, backend, dataset, rows + 1)
    else:
        device_bytes = more = 0
        params, steps = layout.size, config.train.epochs * steps_per_epoch(
            train_rows(dataset, config.data.val_size), config.train)
    largest_layer = max((math.prod(s) for s in layout.shapes), default=0)
    # initialisation draws each layer in float64; a checkpoint copies parameters and optimizer state twice
    host = 8 * largest_layer + 2 * 4 * params * 4 + HOST_BYTES_PER_STEP * min(steps, MAX_TOTAL_STEPS + 1)
    return Need(device_bytes, host, more - device_bytes), rows, steps


def available(backend) -> tuple[int | None, int | None]:
    """(free device bytes, available host bytes); None where unknown. The cpu backend's device is the host."""
    return backend.free_bytes(), host_available()


def check_fits(config, backend, dataset) -> None:
    """Refuse, with one line saying what would fit, a run whose buffers exceed the memory free now. Where the
    GPU's free memory is not known (a packed group's later lanes, which allocate nothing new:
    lane_slabs.LaneBackend.free_bytes), only the host's need is estimated: the whole estimate, which lays the
    buffers out twice, took 4.1 ms a lane of a packed sweep's start under a profiler (benchmarks/NOTES.md, issue 30
    step 31)."""
    device_free, host_free = available(backend)
    need, rows, steps = estimate(config, backend, dataset, device=device_free is not None or backend.name != "cuda")
    if steps > MAX_TOTAL_STEPS:
        raise UserError(f"train.epochs={config.train.epochs}: {steps:,} optimizer steps; a run takes at most "
                        f"{MAX_TOTAL_STEPS:,} (its step counter and per-step records)")
    where = "GPU" if backend.name == "cuda" else "host"
    device_need = need.device + (need.host if backend.name != "cuda" else 0)
    if device_free is not None and device_need > HEADROOM * device_free:
        raise OutOfMemory(f"{_too_much(device_need, device_free, where)}; "
                        f"{_what_fits(config, need, rows, device_need - HEADROOM * device_free, steps, device_need)}")
    if backend.name == "cuda" and host_free is not None and need.host > HEADROOM * host_free:
        raise OutOfMemory(f"{_too_much(need.host, host_free, 'host')}; "
                        f"{_what_fits(config, need, rows, need.host - HEADROOM * host_free, steps, need.host)}")


def _too_much(need: float, free: float, where: str) -> str:
    """What does not fit, in words that cannot read as a contradiction: a run may use only part of what is
    free (HEADROOM), so "needs 21.9 GiB and 22.8 GiB is free" was a refusal that looked like room to spare."""
    limit = binding_limit() if where == "host" else ""
    return (f"the run needs about {gib(need)} of {where} memory, more than the {gib(HEADROOM * free)} it may use "
            f"({gib(free)} free{f' under {limit}' if limit else ''}, less {1 - HEADROOM:.0%} kept for the system)")


def _what_fits(config, need: Need, rows: int, excess: float, steps: int, total: float) -> str:
    t = config.train
    fewer = math.ceil(excess / need.per_row_device) if need.per_row_device else rows
    fits, parts = rows - fewer, []
    if fits >= 1 and t.batch_size > fits:
        accumulate = math.ceil(t.batch_size * t.grad_accum_steps / fits)
        parts.append(f"train.batch_size={fits} train.grad_accum_steps={accumulate}")
    if fits >= 1 and t.eval_batch_size > fits:
        parts.append(f"train.eval_batch_size={fits}")
    if parts:
        return f"{' '.join(parts)} would fit (the effective batch kept by accumulating)"
    if steps * (DEVICE_BYTES_PER_STEP + HOST_BYTES_PER_STEP) > excess:
        return f"its {steps:,} optimizer steps' records alone do not; lower train.epochs"
    fixed = total - rows * need.per_row_device  # what no batch size changes
    return (f"the model's own buffers (parameters, gradients, optimizer state: about {gib(fixed)}) leave no room "
            "for even one row per batch, so no batch size fits; make model.hidden or model.channels smaller")


def check_model_fits(config, backend, dataset, rows: int, flag: str) -> None:
    """Refuse a model with `rows` batch rows and the whole dataset resident (feature extraction) that
    exceeds the memory free now, naming the `flag` value that would fit."""
    def need(r: int) -> int:
        counting = CountingBackend(backend)
        whole_split(counting, dataset.train_images, dataset.train_labels)
        whole_split(counting, dataset.test_images, dataset.test_labels)
        make_model(config, counting, dataset, r)
        return counting.bytes + 4 * (len(dataset.train_images) + len(dataset.test_images)) * \
            math.prod(dataset.image_shape)  # the float32 features on the host, at most as wide as the input

    free, _ = available(backend)
    total = need(rows)
    if free is None or total <= HEADROOM * free:
        return
    per_row = max(need(rows + 1) - total, 1)
    fits = rows - math.ceil((total - HEADROOM * free) / per_row)
    hint = f"{flag} {fits} would fit" if fits >= 1 else "even one image at a time does not fit"
    raise UserError(f"{flag} {rows}: needs about {gib(total)} of {'GPU' if backend.name == 'cuda' else 'host'} "
                    f"memory and {gib(free)} is free; {hint}")
