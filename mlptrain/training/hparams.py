"""A run's entry in TensorBoard's HParams dashboard: its hyperparameters, written into the run's own event
file (so the dashboard lists each run once, under its own name).

Only the session is written (its start info: the hyperparameters; its end info), no experiment summary:
the dashboard then builds the table from every session it finds, marks the hyperparameters whose values
differ between runs and lists those first (a sweep's varied keys lead, the constant ones follow), and
takes its metric columns from the runs' own scalars (`val/acc`, `test/loss`, ...: their last values), so
no one-point `hparam/*` charts are needed.
"""

from __future__ import annotations

from mlptrain.config.load import resolved_dict
from mlptrain.config.schema import Config
from mlptrain.run_dirs.event_files import EventFile, event_suffix
from mlptrain.util.user_paths import readable


def hparam_values(config: Config, backend: str | None = None, data_root=None) -> dict:
    """Dotted keys to scalar values (see `_cell`: lists and whole numbers as text, an unset value such as
    data.path as a blank cell rather than `None`, text `readable`: TensorBoard's strings are UTF-8) of the
    config as the run used it (see `resolved_dict`), with the effective batch size; the description and the
    logging section are left out."""
    def flatten(values: dict, prefix: str):
        for key, value in values.items():
            if isinstance(value, dict):
                yield from flatten(value, f"{prefix}{key}.")
            elif key != "description":
                yield prefix + key, _cell(value)

    resolved = resolved_dict(config, backend, data_root)
    resolved.pop("logging", None)  # where the run logs is no hyperparameter
    values = dict(flatten(resolved, ""))
    values["train.effective_batch_size"] = _cell(config.train.effective_batch_size)
    return values


def _cell(value):
    """A value as the dashboard should show it: an unset one blank, a list as its text, and a whole number as
    text too, since the dashboard writes every number to five significant digits (a batch of 128 as
    128.00, seed 0 as 0.0000); other numbers stay numbers, to filter by range and plot."""
    if value is None:
        return ""
    if isinstance(value, list) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    return readable(value) if isinstance(value, str) else value


def write_session(events, values: dict) -> None:
    """The session start and end infos of `values` into an event file (mlptrain.run_dirs.event_files.EventFile)."""
    # tensorboardX only once a run writes its events; EventFile has imported it without torch
    from tensorboardX.summary import hparams

    _, start, end = hparams(values, {})
    events.add(start)
    events.add(end)


def log_session(run_dir, values: dict) -> None:
    """`write_session` for a run whose event file is closed (a sweep trial that was pruned or failed): a new
    event file in the run's own directory, which TensorBoard reads as the same run."""
    # the suffix keeps it apart from the run's own file, whose name may carry the same second
    events = EventFile(run_dir, event_suffix(".hparams"))
    try:
        write_session(events, values)
    finally:
        events.close()
