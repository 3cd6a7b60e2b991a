"""What a sweep's worker asks of the study while it trains trials (mlptrain.sweep.engine), without Optuna.

A worker takes a queued trial (`claim`: its number, its trial id and the parameters the sampler chose for it),
records the trial's run folder, reports each evaluation's metric (and, for a sweep that prunes, asks whether to
stop), and tells the outcome, or queues the trial again when it stops without one. Two sources answer this:
the study itself, in the worker's own process (mlptrain.sweep.study_trials), and a pipe to the sweep's command,
which keeps the study (mlptrain.sweep.trainer_pipe): a worker of that kind never imports Optuna, whose import
and study held up a single-GPU sweep's first step by ~0.4 s (benchmarks/NOTES.md, issue 30).

Every source has these methods (the calls a trial makes, in order):
- `claim()`: a Claim, or None when no trial is queued;
- `running()`: the numbers of the trials other workers are running;
- `beating(claim)`: a context in which the trial's heartbeat beats;
- `set_run_dir(claim, path)`, `report(claim, value, epoch)`: Futures, written behind the training (a trial
  waits for them before its outcome is told);
- `should_prune(claim, value, epoch)`: the report, then the pruner's answer;
- `requeue(claim)`: the trial, stopped without an outcome, queued to run again;
- `tell(claim, state, metrics, value, error)`: a Future of whether the study took the outcome (False: another
  worker took the trial over);
- `trial_ended()`: after each trial with an outcome (the sweep's results are saved then).
"""

from __future__ import annotations

from dataclasses import dataclass

COMPLETE, PRUNED, FAIL = "complete", "pruned", "fail"  # a trial's outcomes, as `tell` takes them


@dataclass(frozen=True)
class Claim:
    """A queued trial a worker now runs: no other worker takes it."""

    number: int
    trial_id: int
    params: dict


class Pruned(Exception):
    """Raised by a trial's evaluation when the pruner stops it; its message says why."""
