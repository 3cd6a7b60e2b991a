"""Sweep files: a base config, the parameters to vary, the method, and the metric to rank by.

    base: adam_mnist.yaml        # a path relative to the sweep file, or a built-in config name
    method: grid                 # grid (the default) | random | tpe
    trials: 20                   # random and tpe; a grid runs its whole product
    metric: val_acc              # a key of summary.json (METRICS)
    direction: maximize          # default: the metric's own (accuracy up, loss down)
    prune: false                 # true or median | successive_halving | hyperband: stop unpromising trials
    parameters:
      optim.lr: {low: 1.0e-4, high: 1.0e-2, log: true}    # a range (random, tpe); `step` discretises it
      train.batch_size: [64, 128, 256]                      # a choice: a grid axis

`load_sweep` checks all of it before anything is created. A value that no
combination of the other parameters accepts (`optim.lr: [-1]`) is a mistake in
the file; a combination that the config rejects is only a failed trial.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from mlptrain.config.load import (apply_overrides, base_config, config_from_dict, marked_description, parse_override,
                                  read_config, read_yaml)
from mlptrain.config.rules import check_model_keys
from mlptrain.config.safe_yaml import brief
from mlptrain.config.schema import Config, type_hints, valid_keys
from mlptrain.config.suggestions import suggest_key, suggest_value
from mlptrain.errors import UserError, problems_error

# The summary.json keys a sweep can rank by, with their natural direction: a classifier's accuracy and
# loss, the autoencoder's reconstruction MSE. The PER_EPOCH ones are in every evaluation record too, so
# they can prune. A model with new metrics adds them here.
METRICS = {"val_acc": "maximize", "val_loss": "minimize", "test_acc": "maximize", "test_loss": "minimize",
           "val_mse": "minimize", "test_mse": "minimize", "best_val_acc": "maximize", "best_val_mse": "minimize",
           "samples_per_s": "maximize", "wall_s": "minimize"}
PER_EPOCH_METRICS = ("val_acc", "val_loss", "test_acc", "test_loss", "val_mse", "test_mse")
METHODS = ("grid", "random", "tpe")
PRUNERS = ("median", "successive_halving", "hyperband")  # `prune: true` is the median's (mlptrain.sweep.study)
KEYS = ("description", "base", "method", "trials", "metric", "direction", "prune", "parameters")
RANGE_KEYS = ("low", "high", "log", "step")
MAX_CONTEXTS = 64  # combinations of the other parameters tried before a value is called invalid
MAX_TRIALS = 10_000  # every trial is queued in the study when it is created


def _scalar(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


@dataclass(frozen=True)
class Choice:
    """One value of a list. Optuna stores scalars only, so a list value (`model.hidden: [[64], [128]]`)
    is stored as its JSON text and mapped back by position."""

    name: str
    values: tuple

    @property
    def stored(self) -> list:
        return [v if _scalar(v) else json.dumps(v) for v in self.values]

    @property
    def corners(self) -> tuple:
        return self.values

    def suggest(self, trial):
        return self.decode(trial.suggest_categorical(self.name, self.stored))

    def decode(self, stored):
        return self.values[self.stored.index(stored)]

    def describe(self) -> dict:
        return {"choices": list(self.values)}


@dataclass(frozen=True)
class Range:
    """A number between low and high (inclusive), uniform or log-uniform, optionally on a grid of `step`."""

    name: str
    low: float
    high: float
    log: bool
    step: float | None
    integer: bool

    @property
    def corners(self) -> tuple:
        return self.low, self.high

    def suggest(self, trial):
        if self.integer:
            return trial.suggest_int(self.name, self.low, self.high, step=self.step or 1, log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def decode(self, stored):
        return stored

    def describe(self) -> dict:
        return {"low": self.low, "high": self.high, "log": self.log, "step": self.step}


@dataclass(frozen=True)
class Sweep:
    raw: dict  # the base config with the command's overrides, before any parameter
    method: str
    trials: int  # a grid's size for a grid
    metric: str
    direction: str
    prune: bool | str  # False, True (the median pruner) or one of PRUNERS, as the file says
    parameters: tuple
    changed: tuple = ()  # keys set over the config that wrote the description (config.load.read_config)

    def grid(self) -> list[dict]:
        """Every point of the product, as stored values, in the file's order (the last parameter fastest)."""
        names = [p.name for p in self.parameters]
        return [dict(zip(names, point)) for point in itertools.product(*(p.stored for p in self.parameters))]

    def suggest(self, trial) -> dict:
        return {p.name: p.suggest(trial) for p in self.parameters}

    def decode(self, stored: dict) -> dict:
        return {p.name: p.decode(stored[p.name]) for p in self.parameters if p.name in stored}

    def trial_config(self, params: dict, source: str) -> Config:
        """A trial's config. A trial is never resumed (a re-run starts afresh), so unless its config sets
        train.checkpoint_every_epochs it writes its checkpoints once, at its end: `last` and `best`."""
        raw = self.raw if "description" in params else marked_description(self.raw, [*self.changed, *params])
        config = _build(raw, params, source)
        if "checkpoint_every_epochs" in (self.raw.get("train") or {}) or "train.checkpoint_every_epochs" in params:
            return config
        return dataclasses.replace(config, train=dataclasses.replace(config.train,
                                                                     checkpoint_every_epochs=config.train.epochs))

    def definition(self) -> dict:
        """What makes two runs of the sweep command the same sweep (JSON values), for resuming: the base
        config as written, with the overrides (so a key added to the schema later changes nothing)."""
        return json.loads(json.dumps({
            "base": self.raw, "method": self.method, "trials": self.trials,
            "metric": self.metric, "direction": self.direction, "prune": self.prune,
            "parameters": {p.name: p.describe() for p in self.parameters},
        }))


def _build(raw: dict, params: dict, source: str, read: str | None = None) -> Config:
    # JSON text is YAML, so each value takes the path of a command-line override
    config = config_from_dict(apply_overrides(raw, [f"{k}={json.dumps(v)}" for k, v in params.items()]), source)
    if read is not None:  # checking the file: a parameter no combination's model reads would change nothing
        check_model_keys(config.model.type, {read: params[read]}, source)
    return config


def _unknown(where: str, key, valid) -> UserError:
    key = str(key)
    close = suggest_key(key, list(valid)) if len(key) < 100 else None
    hint = f"did you mean '{close}'?" if close else f"valid: {', '.join(valid)}"
    return UserError(f"{where}: unknown key {brief(key)}; {hint}")


def _pick(value, options, where: str):
    if not isinstance(value, str) or value not in options:
        close = suggest_value(str(value), list(options)) if len(str(value)) < 100 else None
        hint = f"; did you mean '{close}'?" if close else ""
        raise UserError(f"{where}: {brief(value)} is not one of {', '.join(options)}{hint}")
    return value


def _positive_int(value, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TRIALS:
        raise UserError(f"{where}: expected a whole number in [1, {MAX_TRIALS:,}], got {brief(value)}")
    return value


def _number(value, integer: bool, where: str):
    if isinstance(value, str) and not integer:  # YAML 1.1 reads `1e-4` (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    ok = isinstance(value, int) if integer else isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or isinstance(value, bool):
        raise UserError(f"{where}: expected {'a whole number' if integer else 'a number'}, got {brief(value)}")
    return value if integer else float(value)


def _field_type(dotted: str):
    cls = Config
    *sections, leaf = dotted.split(".")
    for section in sections:
        cls = type_hints(cls)[section]
    return type_hints(cls)[leaf]


def _number_type(dotted: str):
    """int or float for a numeric config key, else None (`float | None` counts as float)."""
    tp = _field_type(dotted)
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        options = [t for t in typing.get_args(tp) if t is not type(None)]
        tp = options[0] if len(options) == 1 else None
    return tp if tp in (int, float) else None


def _range(name: str, spec: dict, where: str) -> Range:
    for key in spec:
        if key not in RANGE_KEYS:
            raise _unknown(where, key, RANGE_KEYS)
    kind = _number_type(name)
    if kind is None:
        raise UserError(f"{where}: a range needs a numeric key; list the values of {name} instead")
    if "low" not in spec or "high" not in spec:
        raise UserError(f"{where}: a range needs both low and high")
    low, high = (_number(spec[k], kind is int, f"{where}.{k}") for k in ("low", "high"))
    log, step = spec.get("log", False), spec.get("step")
    if not isinstance(log, bool):
        raise UserError(f"{where}.log: expected true or false, got {brief(log)}")
    if step is not None and _number(step, kind is int, f"{where}.step") <= 0:
        raise UserError(f"{where}.step: must be > 0, got {brief(step)}")
    if low >= high:
        raise UserError(f"{where}: low ({low}) must be below high ({high})")
    if log and low <= 0:
        raise UserError(f"{where}: a log range needs low > 0, got {low}")
    if log and step is not None and not (kind is int and step == 1):
        raise UserError(f"{where}: log and step do not combine; drop one")
    return Range(name, low, high, log, step if step is None or kind is int else float(step), kind is int)


def _parameter(name: str, spec, method: str, source: str):
    where = f"{source}: parameters: {name}"
    if name not in valid_keys():
        raise _unknown(f"{source}: parameters", name, valid_keys())
    if isinstance(spec, list):
        texts = [json.dumps(v, sort_keys=True) for v in spec]
        if not spec or len(set(texts)) != len(texts):
            raise UserError(f"{where}: expected a list of distinct values, got {brief(spec)}")
        if typing.get_origin(_field_type(name)) is tuple and not all(isinstance(v, list) for v in spec):
            raise UserError(f"{where}: each choice is one value of {name}, itself a list: write "
                            f"{json.dumps([v if isinstance(v, list) else [v] for v in spec])}")
        return Choice(name, tuple(spec))
    if isinstance(spec, dict):
        if method == "grid":
            raise UserError(f"{where}: a grid needs a list of values, not a range; list them "
                            "(e.g. [1.0e-4, 1.0e-3, 1.0e-2]) or use method random or tpe")
        return _range(name, spec, where)
    raise UserError(f"{where}: expected a list of values or a range {{low: ..., high: ...}}, got {brief(spec)}")


def _check_values(raw: dict, parameters: tuple, source: str, problems: _Problems) -> None:
    """Each choice and each end of each range must make a valid config with at least one combination
    of the other parameters' values (up to MAX_CONTEXTS of them); the first value of each parameter that
    makes none is noted in `problems`."""
    for p in parameters:
        others = [q for q in parameters if q is not p]
        contexts = list(itertools.islice(itertools.product(*(q.corners for q in others)), MAX_CONTEXTS))
        for value in p.corners:
            errors = []
            for context in contexts:
                params = {p.name: value, **{q.name: v for q, v in zip(others, context)}}
                try:
                    _build(raw, params, f"{source}: parameters", read=p.name)
                    break
                except UserError as err:
                    errors.append(err)
            if len(errors) == len(contexts):
                problems.note(str(errors[0]))
                break


def _check_pruned_metric(config: Config, parameters: tuple, metric: str, prune, source: str,
                         problems: "_Problems") -> None:
    """A pruned test metric needs the test split evaluated every epoch: with train.eval_test end (the default)
    its trials would report nothing to prune on."""
    if not prune or not metric.startswith("test_"):
        return
    varied = next((p for p in parameters if p.name == "train.eval_test"), None)
    if "end" in (varied.corners if varied is not None else (config.train.eval_test,)):
        problems.note(f"{source}: prune: {metric} is evaluated only at the end of a run (train.eval_test: end); "
                      "prune on a validation metric, or set train.eval_test=every_epoch")


def _settings(raw: dict, source: str, problems: "_Problems"):
    """(method, trials or None, metric, direction, prune) from a sweep file; each mistake is noted in
    `problems` (None stands in for a setting that has one)."""
    method = problems.check(_pick, raw.get("method", "grid"), METHODS, f"{source}: method")
    metric = problems.check(_pick, raw["metric"], METRICS, f"{source}: metric") if raw.get("metric") is not None \
        else None  # noted missing (or misspelt) by the caller
    direction = problems.check(_pick, raw.get("direction", METRICS.get(metric, "maximize")),
                               ("maximize", "minimize"), f"{source}: direction")
    prune = raw.get("prune", False)
    if not isinstance(prune, bool) and prune not in PRUNERS:
        problems.note(f"{source}: prune: expected true, false or one of Optuna's pruners {', '.join(PRUNERS)}, "
                      f"got {brief(prune)}")
    elif prune and metric is not None and metric not in PER_EPOCH_METRICS:
        problems.note(f"{source}: prune: {metric} is known only at the end of a run; pruning needs a metric "
                      f"of every evaluation: {', '.join(PER_EPOCH_METRICS)}")
    trials = None
    if method not in ("grid", None) and "trials" not in raw:
        problems.note(f"{source}: trials: method {method} needs the number of trials to run")
    elif "trials" in raw:
        trials = problems.check(_positive_int, raw["trials"], f"{source}: trials")
    return method, trials, metric, direction, prune


class _Problems:
    """The mistakes of one sweep file, noted as they are found so that one line names them all (a file fixed
    one mistake per run took as many runs as it had mistakes)."""

    def __init__(self, source: str):
        self.source, self.found = source, []

    def note(self, message: str) -> None:
        self.found.append(message)

    def check(self, check, *args):
        """check(*args), or None with its UserError noted."""
        try:
            return check(*args)
        except UserError as err:
            self.note(str(err))
            return None

    def raise_any(self) -> None:
        if self.found:
            raise problems_error(self.found, self.source)


def load_sweep(path: Path, overrides: list[str]) -> Sweep:
    """Read and check a sweep file. Its `base:` is found as a config's is (config.load.base_config): beside the
    sweep file, else a built-in config."""
    raw, source = read_yaml(path), str(path)
    if not isinstance(raw, dict):
        raise UserError(f"{source}: a sweep file must be a mapping (base, method, metric, parameters, ...)")
    problems = _Problems(source)
    meant = set()  # the keys that unknown ones were likely meant as: not also reported missing
    for key in raw:
        if key not in KEYS:
            problems.note(str(_unknown(source, key, KEYS)))
            meant.add(suggest_key(str(key), list(KEYS)) if len(str(key)) < 100 else None)
    for key in ("base", "metric", "parameters"):
        if raw.get(key) is None and key not in meant:
            problems.note(f"{source}: '{key}' is missing (a sweep file names {', '.join(KEYS[1:])})")
    config_raw = checked = None
    if raw.get("base") is None:
        pass  # noted missing (or misspelt) above
    elif not isinstance(raw["base"], str):
        problems.note(f"{source}: base: expected a config file or name, got {brief(raw['base'])}")
    else:
        try:
            base = base_config(raw["base"], path)
            base_raw, changed = read_config(base)
            config_raw = apply_overrides(base_raw, overrides)
            checked = config_from_dict(config_raw,
                                       source=f"{base} (with the command's overrides)" if overrides else str(base))
        except UserError as err:
            problems.note(str(err))
    method, trials, metric, direction, prune = _settings(raw, source, problems)
    if raw.get("parameters") is None:
        parameters = ()  # noted missing (or misspelt) above
    elif not isinstance(raw["parameters"], dict) or not raw["parameters"]:
        problems.note(f"{source}: parameters: expected a mapping of config keys to values or ranges, "
                      f"e.g. optim.lr: [1.0e-4, 1.0e-3]")
        parameters = ()
    else:
        # a misspelt method: its parameters are checked as random's (lists and ranges), not also faulted
        parameters = tuple(problems.check(_parameter, str(name), spec, method or "random", source)
                           for name, spec in raw["parameters"].items())
    problems.raise_any()  # what follows builds configs from all of these
    given = [parse_override(text) for text in overrides]
    if "model.type" not in raw["parameters"]:  # else some trials' model may read what the others' do not
        check_model_keys(checked.model.type, dict(given), "override")
    for text, (key, _) in zip(overrides, given):
        if key in raw["parameters"]:
            raise UserError(f"override '{text}': {source} varies {key}; drop the override or the parameter")
    if method == "grid":
        trials = math.prod(len(p.values) for p in parameters)
        if trials > MAX_TRIALS:
            raise UserError(f"{source}: parameters: the grid has {trials:,} points; a sweep runs at most "
                            f"{MAX_TRIALS:,} trials (fewer values, or method random or tpe)")
    _check_values(config_raw, parameters, source, problems)
    _check_pruned_metric(checked, parameters, metric, prune, source, problems)
    problems.raise_any()
    changed = (*changed, *(key for key, _ in given if key != "description"))
    return Sweep(config_raw, method, trials, metric, direction, prune, parameters,
                 () if "description" in dict(given) else changed)
