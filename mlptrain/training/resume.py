"""What a checkpoint holds about the run's progress, and `mlptrain run --resume RUN_DIR`.

A run is a deterministic function of its config: the initial parameters and each epoch's order
depend on (seed, epoch) only, and everything else that evolves lives in the checkpoint (parameters,
optimizer state, the device step state: step count, loss scale, growth tracker, skipped windows, lr
factor, grad-norm record; the plateau schedule; the epoch, the window reached in the next epoch and
the best metric). So a resumed run refills the epoch's order, continues at the saved window and ends
bitwise where the uninterrupted run ends.

Overrides may only extend `train.epochs`. That changes the run's total steps and so the lr table of
schedules that depend on it (cosine, warmup_linear, ...): from the resumed step on they follow the
longer horizon, so such a run differs from one that never stopped; constant, step, inverse_sqrt and
plateau do not. A run that checkpoints every k > 1 epochs resumes from its last checkpoint and
redoes the epochs after it (their metrics.jsonl records appear twice).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlptrain.config.load import load_config, parse_override, resolved_dict
from mlptrain.config.schema import Config
from mlptrain.errors import TrainingDiverged, UserError
from mlptrain.run_dirs.links import check_no_links
from mlptrain.run_dirs.lock import lock_run
from mlptrain.run_dirs.records import check_metrics_lines
from mlptrain.training.checkpoint import load_checkpoint
from mlptrain.training.diagnosis import likely_cause
from mlptrain.training.fallbacks import warn
from mlptrain.util.regular_file import read_regular_bytes

# Keys that do not change what training computes, so config.yaml may differ in them on resume: where the
# data lives (that it is the same data, `mlptrain run --resume` checks by its checksum), how often the host
# looks, how and when evaluation is done, and train.epochs (which may grow)
NOT_TRAINING = ("description", "backend", "data.root", "data.path", "train.epochs", "train.log_every",
                "train.eval_batch_size", "train.eval_test", "train.checkpoint_every_epochs", "train.cuda_graphs",
                "logging.mlflow", "logging.mlflow_uri", "logging.mlflow_experiment")


@dataclass(frozen=True)
class Position:
    """Where training stands: `epoch` epochs complete, `window` optimizer steps of the next one done."""

    epoch: int = 0
    window: int = 0
    best: float | None = None  # the best value so far of the metric that picks the `best` checkpoint
    best_epoch: int = 0  # the epoch that reached it: early stopping counts the evaluations since
    wall_s: float = 0.0  # the run's seconds so far, over every process that trained it


@dataclass(frozen=True)
class Resume:
    """A run directory's last checkpoint, checked against its config."""

    path: Path
    arrays: dict
    position: Position
    finished: bool = False  # every epoch was trained (or early stopping ended it) but summary.json was never written


def training_config(config: Config) -> dict:
    """The config's dotted keys that decide what training computes (all but NOT_TRAINING)."""
    def flatten(values: dict, prefix: str = ""):
        for key, value in values.items():
            if isinstance(value, dict):
                yield from flatten(value, f"{prefix}{key}.")
            elif prefix + key not in NOT_TRAINING:
                yield prefix + key, value

    return dict(flatten(resolved_dict(config)))  # only its own model type's keys, as config.yaml holds them


def _saved_config(arrays: dict) -> dict | None:
    saved = arrays.get("meta/config")
    if saved is None:
        return None
    try:
        return json.loads(saved.astype(np.uint8).tobytes().decode())
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
        return {}


class HeldCheckpoint:
    """A checkpoint as it was at its position: the device's arrays on their way to the host (Backend.to_host_later)
    and the rest on the host already. `arrays` waits for them and returns what the file holds, the device's arrays
    where the copies landed (pinned memory on a GPU: no copy of them is made); `drop` gives them up, written or
    not (a held best that a better epoch replaced), after which `arrays` is not to be used."""

    def __init__(self, model, step, config: Config, copies, keys: list[str], host: dict[str, np.ndarray]):
        self._model, self._step, self._config = model, step, config
        self._copies, self._keys, self._host = copies, keys, host
        self._arrays = None

    def arrays(self) -> dict[str, np.ndarray]:
        """The checkpoint's arrays (see checkpoint_later); raises TrainingDiverged rather than give non-finite
        parameters, so the last good checkpoint on disk is never replaced by a diverged one."""
        if self._arrays is None:
            params, *state = self._copies.views()
            arrays = self._model.params.split(params, prefix="params/")
            if not np.isfinite(params).all():
                now = self._step.read()
                raise TrainingDiverged(f"the parameters became non-finite by optimizer step {now['steps']}; "
                                       f"{likely_cause(self._config, now)}")
            self._arrays = {**arrays, **dict(zip(self._keys, state)), **self._host}
        return self._arrays

    def drop(self) -> None:
        self._arrays = None
        self._copies.drop()


def device_arrays(model, step) -> list:
    """The device arrays of a checkpoint, in the order HeldCheckpoint takes them: the parameters, then the step's
    state by its keys."""
    return [model.params.flat, *step.device_state().values()]


def checkpoint_later(model, step, plateau, position: Position, config: Config, best_metric: str,
                     extra: dict[str, np.ndarray] | None = None, copies=None) -> HeldCheckpoint:
    """The checkpoint at `position` of the parts of a run that evolve: the model's parameters, the optimizer
    step (its device state and the optimizer's), the plateau schedule (or None), `extra` host arrays;
    `best_metric` names the metric that picks the `best` checkpoint. The device's arrays are copied behind the
    host's back, as the launches queued so far leave them; nothing queued later changes the checkpoint.
    `copies`: those copies queued earlier (Backend.to_host_later of device_arrays), at the position."""
    keys = list(step.device_state())  # the order device_arrays gives them in, after the parameters
    if copies is None:
        copies = model.params.backend.to_host_later(device_arrays(model, step))
    host = dict(plateau.state_dict()) if plateau is not None else {}
    host["meta/epoch"] = np.array(position.epoch, np.int64)
    host["meta/window"] = np.array(position.window, np.int64)
    host["meta/seed"] = np.array(config.seed, np.int64)
    # what the run was trained with, so that a config.yaml edited afterwards is refused on resume
    host["meta/config"] = np.frombuffer(json.dumps(training_config(config), sort_keys=True).encode(), np.uint8)
    best = np.nan if position.best is None else position.best
    host[f"meta/best_{best_metric}"] = np.array(best, np.float64)
    host["meta/best_epoch"] = np.array(position.best_epoch, np.int64)
    host["meta/wall_s"] = np.array(position.wall_s, np.float64)
    return HeldCheckpoint(model, step, config, copies, keys, {**host, **(extra or {})})


def restore(resume: Resume, model, step, plateau, best_metric: str, steps_per_epoch: int) -> Position:
    """Load a checkpoint into the parts `checkpoint_later` saves; raises UserError (naming the file)
    when it belongs to another model or run."""
    try:
        model.load_parameters(resume.arrays, prefix="params/")  # also refreshes the fp16/bf16 compute copy
        step.load_state_dict(resume.arrays)
        if plateau is not None:
            plateau.load_state_dict(resume.arrays)
        key = f"meta/best_{best_metric}"
        if key not in resume.arrays:
            raise UserError(f"checkpoint: '{key}' is missing")
    except UserError as err:
        raise UserError(f"{resume.path}: {err}; was it written by another model or config?") from None
    if resume.position.window >= steps_per_epoch:
        raise UserError(f"{resume.path}: meta/window {resume.position.window} is beyond the epoch's "
                        f"{steps_per_epoch} optimizer steps")
    best = float(resume.arrays[key])
    # checkpoints written before these fields: the best epoch unknown (taken as the last), no time recorded
    best_epoch = int(resume.arrays.get("meta/best_epoch", resume.position.epoch))
    wall_s = float(resume.arrays.get("meta/wall_s", 0.0))
    return Position(resume.position.epoch, resume.position.window, None if math.isnan(best) else best, best_epoch,
                    wall_s)


def prepare_resume(run_dir: Path, overrides: list[str]) -> tuple[Config, Resume]:
    """The run's config (train.epochs possibly extended) and its last checkpoint, with the run directory
    locked for this process; raises UserError before anything is written."""
    if not run_dir.is_dir():
        raise UserError(f"--resume {run_dir}: no such run directory")
    check_no_links(run_dir)  # before the lock: its .lock, metrics.jsonl and checkpoints are written to
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"--resume {run_dir}: no config.yaml, so not a run directory")
    for text in overrides:
        key, _ = parse_override(text)
        if key != "train.epochs":
            raise UserError(f"--resume: override '{key}' would change the run; only train.epochs may be "
                            "extended when resuming (start a new run for other changes)")
    lock_run(run_dir, "--resume")
    config = load_config(run_dir / "config.yaml", overrides)
    path = run_dir / "checkpoints" / "last.npz"
    if not path.is_file():
        raise UserError(f"--resume {run_dir}: no checkpoints/last.npz (the run stopped before its first "
                        "checkpoint); start it again")
    arrays = load_checkpoint(path)
    check_same_config(path, arrays, config)
    position = _position(path, arrays, config)
    stopped = stopped_early(arrays, config, position)
    finished = (position.epoch == config.train.epochs and not position.window) or stopped is not None
    if finished and (run_dir / "summary.json").is_file():
        if stopped is not None:
            raise UserError(f"--resume {run_dir}: the run stopped early after epoch {position.epoch} (no improvement "
                            f"since epoch {stopped} in train.early_stopping.patience="
                            f"{config.train.early_stopping.patience} evaluations); there is nothing to resume")
        raise UserError(f"--resume: the run has already trained {position.epoch} epochs of train.epochs="
                        f"{config.train.epochs}; to train longer, extend it with train.epochs=N (N > {position.epoch})")
    _check_metrics(run_dir / "metrics.jsonl")
    return config, Resume(path, arrays, position, finished)


def _check_metrics(path: Path) -> None:
    """A damaged record before metrics.jsonl's last line is refused now, before anything is written; a cut
    last line is mended when the run appends (mlptrain.run_dirs.records.mend_metrics)."""
    try:
        data = read_regular_bytes(path)
    except OSError:  # absent (the run stopped before its first evaluation), or unreadable: said on appending
        return
    check_metrics_lines(data, path)


def stopped_early(arrays: dict, config: Config, position: Position) -> int | None:
    """The best epoch when the checkpoint is where early stopping ended the run, else None."""
    stopping, best_epoch = config.train.early_stopping, int(arrays.get("meta/best_epoch", position.epoch))
    if stopping.patience is None or position.window or position.epoch - best_epoch < stopping.patience:
        return None
    return best_epoch


def check_same_config(path: Path, arrays: dict, config: Config, command: str = "--resume",
                      remedy: str = "only train.epochs may change (start a new run for other changes)") -> None:
    """Refuse a run whose config.yaml (read into `config`) differs, in a key that decides what training
    computes, from the config checkpoint `path` recorded in its `arrays` (`meta/config`; only that entry
    is needed). `command` and `remedy` begin and end the refusal. Every command that reads a run checks
    this: an edited seed or data.val_size would silently evaluate another validation split."""
    saved = _saved_config(arrays)
    if saved is None:
        warn(f"{path} predates the record of its config; config.yaml is trusted as it is")
        return
    now = training_config(config)
    # the other model type's keys (checkpoints written before config.yaml left them out) decide nothing
    saved = {k: v for k, v in saved.items() if k in now or not k.startswith("model.")}
    changed = sorted(key for key in saved.keys() | now.keys() if saved.get(key) != now.get(key))
    if changed:
        shown = ", ".join(f"{k} ({json.dumps(saved.get(k))} -> {json.dumps(now.get(k))})" for k in changed[:4])
        more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
        raise UserError(f"{command}: config.yaml differs from the config the checkpoint was trained with: {shown}"
                        f"{more}; {remedy}")


def _position(path: Path, arrays: dict, config: Config) -> Position:
    try:
        epoch = int(arrays["meta/epoch"])
        window = int(arrays.get("meta/window", 0))  # checkpoints from before mid-epoch saves: epoch ends
        seed = int(arrays["meta/seed"])
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{path}: not a training checkpoint (no meta/epoch or meta/seed)") from None
    if seed != config.seed or epoch < 0 or window < 0:
        raise UserError(f"{path}: its meta/seed {seed} or position does not match the run's config.yaml")
    reached = epoch + (1 if window else 0)
    if config.train.epochs < reached:
        raise UserError(f"--resume: the run has already trained {epoch} epochs"
                        f"{f' and {window} steps' if window else ''} of train.epochs={config.train.epochs}; "
                        f"to train longer, extend it with train.epochs=N (N > {epoch})")
    return Position(epoch, window)
