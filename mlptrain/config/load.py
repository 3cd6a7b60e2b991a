"""Configs read and written: YAML files and `key=value` overrides built into the typed sections of
schema.py, every value converted and checked on the way (errors name the file and the dotted key, and an
unknown key suggests the closest valid one), and the resolved record a run keeps in its config.yaml."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

from mlptrain.config.builtins import builtin_configs
from mlptrain.config.rules import MODEL_KEYS, check_combinations, check_model_keys
from mlptrain.config.safe_yaml import brief, brief_text, load_yaml_text
from mlptrain.config.safe_yaml import read_yaml as read_yaml_file
from mlptrain.config.schema import INT64_MAX, Config, init_scheme, type_hints, valid_keys, valid_sections
from mlptrain.config.suggestions import suggest_key, suggest_value
from mlptrain.errors import UserError, problems_error


def _unknown_key(source, dotted):
    dotted = str(dotted)
    close = suggest_key(dotted, valid_keys()) if len(dotted) < 100 else None
    hint = f"; did you mean '{close}'?" if close else f"; valid keys: {', '.join(valid_keys())}"
    return UserError(f"{source}: unknown key {brief(dotted)}{hint}")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp)).replace("NoneType", "null").replace("int | float", "a number")


def _convert(value, tp, where):
    """Coerce a YAML value to the annotated type, or raise UserError."""
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union) and set(typing.get_args(tp)) == {int, float}:
        # a count or a fraction (data.val_size): a whole number is a count, whatever YAML read it as
        number = _convert(value, float, where)
        return int(number) if number.is_integer() else number
    if origin in (types.UnionType, typing.Union):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        inner = [t for t in options if t is not type(None)][0]
        return _convert(value, inner, where)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {brief(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise UserError(f"{where}: expected a list of {len(args)} values, got {len(value)}")
        return tuple(_convert(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, args)))
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, float) and value.is_integer():  # YAML 1.2 reads `1e3` as a float
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > INT64_MAX:
                raise UserError(f"{where}: {brief(value)} is beyond any setting (at most 2**63 - 1)")
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise UserError(f"{where}: must be a finite number, got {brief(value)}")
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-3` (no dot) as a string
            try:
                return _convert(float(value), float, where)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise UserError(f"{where}: expected {_type_name(tp)}, got {brief(value)}")


def _build(cls, raw, source, prefix="", problems: list | None = None):
    """`cls` built from `raw`, every unknown key and bad value noted in `problems` (the caller's list when
    nested); at the top, they are raised together in one line (a config fixed one mistake per run took
    as many runs as it had mistakes). None where a nested part has a problem."""
    top = problems is None
    problems = [] if top else problems
    values = {}
    if not isinstance(raw, dict):
        where = prefix.rstrip(".") or "the config"
        keys = f" (its keys: {', '.join(f.name for f in dataclasses.fields(cls))})" if prefix else ""
        problems.append(f"{source}: {where} must be a mapping of keys to values{keys}, got {brief(raw)}")
    else:
        hints = type_hints(cls)
        names = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in raw.items():
            if name not in names:
                problems.append(str(_unknown_key(source, f"{prefix}{name}")))
                continue
            f, dotted, tp = names[name], f"{prefix}{name}", hints[name]
            if dataclasses.is_dataclass(tp):
                values[name] = _build(tp, value if value is not None else {}, source, dotted + ".", problems)
                continue
            try:
                values[name] = _field_value(f, tp, value, f"{source}: {dotted}")
            except UserError as err:
                problems.append(str(err))
    if problems and top:
        raise problems_error(problems, source)
    if problems:
        return None
    return cls(**values)


def _field_value(f, tp, value, where: str):
    """`value` converted to the field's type and checked against its choices and check; raises UserError
    starting with `where`."""
    value = _convert(value, tp, where)
    choices, check = f.metadata.get("choices"), f.metadata.get("check")
    if choices and value is not None and value not in choices:
        close = suggest_value(str(value), list(map(str, choices))) if len(str(value)) < 100 else None
        hint = f"; did you mean '{close}'?" if close else ""
        raise UserError(f"{where}: {brief(value)} is not one of {', '.join(map(str, choices))}{hint}")
    problem = check(value) if check and value is not None else None
    if problem:
        raise UserError(f"{where}: {problem} (got {brief(value)})")
    return value


def check_override_values(overrides: list[str]) -> list[tuple[str, Any]]:
    """Each `KEY=VALUE` checked on its own, so that a bad value is blamed on the command line (`override
    optim.lr=fast: expected float, got 'fast'`), not on the config file it lands in; returns each one's
    (dotted key, value) as `parse_override` reads it. Every bad override is named, in one line."""
    parsed, problems = [], []
    for text in overrides:
        dotted, value = parse_override(text)
        parsed.append((dotted, value))
        try:
            _check_override(text, dotted, value)
        except UserError as err:
            problems.append(str(err))
    if problems:
        raise problems_error(problems, "the overrides")
    return parsed


def _check_override(text: str, dotted: str, value) -> None:
    if isinstance(value, dict) and dotted in valid_sections():  # a section given whole: each of its keys
        check_override_values([f"{dotted}.{key}={json.dumps(inner)}" for key, inner in value.items()])
        return
    if dotted in valid_sections():  # `model.init=pytorch`: a section given a plain value
        keys = [k for k in valid_keys() if k.rpartition(".")[0] == dotted]
        raise UserError(f"override {brief_text(text)}: {dotted} is a section; set one of its keys "
                        f"({', '.join(keys)})")
    if dotted not in valid_keys():
        raise _unknown_key("override", dotted)
    cls = Config
    *parents, leaf = dotted.split(".")
    for part in parents:
        cls = type_hints(cls)[part]
    f = {f.name: f for f in dataclasses.fields(cls)}[leaf]
    where = f"override {dotted}={brief_text(text.partition('=')[2].strip())}"
    _field_value(f, type_hints(cls)[leaf], value, where)


def parse_override(text: str) -> tuple[str, Any]:
    """`optim.lr=3e-4` -> ("optim.lr", 0.0003); the value is read as YAML (mlptrain.config.safe_yaml)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override '{brief_text(text)}': expected KEY=VALUE, e.g. optim.lr=3e-4")
    return key.strip(), load_yaml_text(value, f"override '{brief_text(text)}'") if value.strip() else None


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Set dotted keys in a nested dict, creating sections as needed."""
    return _set_values(raw, (parse_override(text) for text in overrides))


def _set_values(raw: dict, values) -> dict:
    """`raw` with each (dotted key, value) of `values` set (`apply_overrides` once they are parsed)."""
    raw = dict(raw)
    for dotted, value in values:
        if dotted not in valid_keys() and not (isinstance(value, dict) and dotted in valid_sections()):
            raise _unknown_key("override", dotted)
        node = raw
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        # a section given whole (`train.early_stopping={patience: 3}`) adds to what the file set there
        node[leaf] = {**node[leaf], **value} if isinstance(value, dict) and isinstance(node.get(leaf), dict) else value
    return raw


def read_yaml(path: Path):
    """A config or sweep file's YAML (bounded, YAML 1.2 numbers, duplicate keys refused: mlptrain.config.safe_yaml)."""
    if not path.exists():
        raise UserError(f"{path}: no such config file (see `mlptrain configs` for the built-in ones)")
    raw = read_yaml_file(path)
    return {} if raw is None else raw


RESOLVED = "resolved"  # the section of a run's config.yaml that records what the run actually used
BASE = "base"  # a config's key naming the config it extends
MAX_BASES = 16  # configs in one chain of `base:`
# keys whose change makes a description stale: descriptions name the model, data, optimizer and schedule, and
# the built-ins also the batch, the epochs and the precision ("batch 128, 10 epochs")
DESCRIBED = ("model.", "data.", "optim.", "schedule.", "train.epochs", "train.batch_size", "train.grad_accum_steps",
             "train.precision")
_MARK = re.compile(r"\s*\[overridden: ([^\]]*)\]$")


def load_config(path: Path, overrides: list[str] = ()) -> Config:
    raw, changed = read_config(path)
    return _with_overrides(raw, changed, overrides, str(path))


def config_from_mapping(raw: dict, overrides: list[str] = (), source: str = "the config") -> Config:
    """`load_config` of a mapping (the Python API's config given as a dict): its `base:` chain is found as a
    file's is, relative to the working directory."""
    if not isinstance(raw, dict):
        raise UserError(f"{source}: a config must be a mapping of sections, got {brief(raw)}")
    merged, changed = _chain(raw, Path.cwd() / "config.yaml", source)
    return _with_overrides(merged, changed, overrides, source)


def _with_overrides(raw: dict, changed: list[str], overrides: list[str], source: str) -> Config:
    parsed = check_override_values(list(overrides))  # each override's YAML read once, here
    source = f"{source} with the overrides" if overrides else source
    raw = _set_values(raw, parsed)
    if "description" not in dict(parsed):
        raw = marked_description(raw, [*changed, *(key for key, _ in parsed)])
    config = config_from_dict(raw, source=source)
    check_model_keys(config.model.type, dict(parsed), "override")
    return config


def read_config(path: Path) -> tuple[dict, list[str]]:
    """The mapping of config file `path` with its chain of `base:` applied (a built-in config name, or a path
    relative to the file that names it): each file's keys override its base's, section by section, as
    overrides do. Also the dotted keys the files set over the config whose description they keep (an
    empty list when the file itself describes what it is). A loop or a chain longer than MAX_BASES is
    refused in one line naming it."""
    return _chain(_mapping(path), path, str(path))


def _mapping(path: Path) -> dict:
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a config must be a mapping of sections, got {type(raw).__name__}")
    return raw


def _chain(raw: dict, named_in: Path, source: str) -> tuple[dict, list[str]]:
    """`raw` (read from `named_in`, or given as `source`) over its chain of bases (see read_config)."""
    layers, chain = [], [named_in]
    while True:
        raw = {k: v for k, v in raw.items() if k != RESOLVED}  # a run's record of what it used: never read back
        base = raw.pop(BASE, None)
        layers.append(raw)
        if base is None:
            break
        where = source if len(chain) == 1 else chain[-1]
        if not isinstance(base, str) or not base.strip():
            raise UserError(f"{where}: base: expected a config file or a built-in config name, got {brief(base)}")
        following = base_config(base, chain[-1], where)
        if any(following.resolve() == seen.resolve() for seen in chain):
            raise UserError(f"{source}: base: the chain loops: {' -> '.join(map(str, [*chain, following]))}")
        if len(chain) == MAX_BASES:
            raise UserError(f"{source}: base: a chain of more than {MAX_BASES} configs ({' -> '.join(map(str, chain))} "
                            "-> ...)")
        chain.append(following)
        raw = _mapping(following)
    merged, changed = {}, []
    for layer in reversed(layers):
        if "description" in layer:
            changed = []
        elif merged.get("description"):
            changed += _dotted_keys(layer)
        merged = _merged(merged, layer)
    return merged, changed


def base_config(base: str, named_in: Path, where=None) -> Path:
    """The file `base:` names in `named_in`: a path relative to that file, else a built-in config name.
    `where` names the config in the error (default: `named_in`)."""
    beside = named_in.parent / base
    if beside.is_file():
        return beside
    builtin = builtin_configs().get(Path(base).stem) if Path(base).parent == Path(".") else None
    if builtin is None:
        raise UserError(f"{where or named_in}: base: '{base}' is neither a file beside it nor a built-in config "
                        f"(built-in: {', '.join(builtin_configs())})")
    return builtin


def _merged(base: dict, top: dict) -> dict:
    """`top` over `base`: mappings merged key by key (a section keeps the base's other keys), anything else replaced."""
    merged = dict(base)
    for key, value in top.items():
        merged[key] = _merged(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def _dotted_keys(raw: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in raw.items():
        name = f"{prefix}{key}"
        keys += _dotted_keys(value, f"{name}.") if isinstance(value, dict) else [name]
    return keys


def marked_description(raw: dict, changed: list[str]) -> dict:
    """`raw` with its description marked `[overridden: KEYS]` when `changed` (dotted keys set over the config
    that wrote the description) includes a key it may describe (DESCRIBED): a description such as "Adam,
    lr 1e-3, 10 epochs" then no longer passes for what ran."""
    description = raw.get("description")
    stale = sorted({key for key in changed if key.startswith(DESCRIBED)})
    if not isinstance(description, str) or not description or not stale:
        return raw
    found = _MARK.search(description)
    if found:  # marked before (a run's own config.yaml, loaded again): one mark, naming every key
        stale = sorted({*stale, *(k.strip() for k in found.group(1).split(","))})
        description = description[:found.start()]
    return {**raw, "description": f"{description} [overridden: {', '.join(stale)}]"}


def config_from_dict(raw: dict, source: str = "config") -> Config:
    config = _build(Config, raw, source)
    check_combinations(config, source)
    return _fill_defaults(config)


def _fill_defaults(config: Config) -> Config:
    """Defaults that depend on other keys, made explicit so that config.yaml records what a run used."""
    weights, biases = init_scheme(config.model)
    init = dataclasses.replace(config.model.init, weights=weights, biases=biases)
    return dataclasses.replace(config, model=dataclasses.replace(config.model, init=init))


def config_to_dict(config: Config) -> dict:
    """Plain YAML-ready values (tuples become lists)."""

    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


def resolved_dict(config: Config, backend: str | None = None, data_root: str | None = None) -> dict:
    """`config_to_dict` as a run records it: `backend` and `data_root` (when given) in place of `auto` and
    the default folder, and only the keys of the config's own model type."""
    values = config_to_dict(config)
    if backend is not None:
        values["backend"] = backend
    if data_root is not None and values["data"].get("root") is None:
        values["data"]["root"] = str(data_root)
    others = {key for keys in MODEL_KEYS.values() for key in keys} - set(MODEL_KEYS[config.model.type])
    values["model"] = {key: value for key, value in values["model"].items() if key not in others}
    return values
