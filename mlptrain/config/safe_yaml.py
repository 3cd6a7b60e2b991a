"""The one YAML reader for configs, sweep files and `key=value` overrides: bounded, and YAML 1.2's numbers.

PyYAML's `safe_load` is safe against code, not against size or shape: an alias bomb ("billion laughs")
expands 500 bytes into gigabytes, a 5,000-deep list overflows Python's stack, a second `train:` section
silently replaces the first, and its YAML 1.1 schema reads `1_0` as 10, `1:30` as 90, `010` as 8 and
`no` as false. This reader keeps PyYAML's scanner and parser and replaces the rest:

- at most MAX_BYTES of text and MAX_DEPTH levels of nesting (checked while composing, so a deep
  document stops at the limit instead of recursing);
- no aliases (`*name`, which is also how merge keys `<<: *base` work): a config writes values out;
- a key twice in one mapping is refused, naming the key and both lines;
- plain scalars follow the YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution):
  `true`/`false`, `null`/`~`, decimal, `0o` and `0x` integers, decimal floats with or without a dot,
  `.inf`/`.nan`; anything else (`1_0`, `1:30`, `yes`, `2024-01-01`) is a string, which the schema
  then refuses for a number or a boolean key with one line. Explicit tags other than the core ones
  (`!!python/...`, `!!set`, `!!binary`, ...) are refused.

Every failure is one UserError line naming the source and the line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent
from yaml.nodes import ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from mlptrain.errors import UserError
from mlptrain.util.regular_file import open_regular

MAX_BYTES = 1_000_000  # a config is a few hundred bytes; a sweep file a few kilobytes
MAX_DEPTH = 32  # a config nests 3 levels (train.loss_scale.init), a sweep file with list values 5
MAX_NUMBER_CHARS = 400  # Python refuses to convert integers of more than 4,300 digits

_TAG = "tag:yaml.org,2002:"
_PLAIN = "mlptrain:plain"  # an untagged plain scalar, resolved by the core schema below
_INT = re.compile(r"[-+]?[0-9]+")
_OCT = re.compile(r"0o[0-7]+")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")
_NULL = ("", "~", "null", "Null", "NULL")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}


class _Refused(Exception):
    def __init__(self, message: str, mark):
        super().__init__(message)
        self.mark = mark


class _Resolver(BaseResolver):
    """Tags only what PyYAML needs to compose; plain scalars keep a marker for the core schema."""

    def resolve(self, kind, value, implicit):
        if kind is ScalarNode:
            return _PLAIN if implicit[0] else _TAG + "str"
        return super().resolve(kind, value, implicit)


class _Composer(Composer):
    """PyYAML's composer, refusing aliases and nesting deeper than MAX_DEPTH before it recurses further."""

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            raise _Refused("YAML aliases (*name, and merge keys <<: *name) are not accepted; write the "
                           "value out", self.peek_event().start_mark)
        self.depth = getattr(self, "depth", 0) + 1
        if self.depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Loader(Reader, Scanner, Parser, _Composer, _Resolver):
    def __init__(self, text: str):
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        _Composer.__init__(self)
        _Resolver.__init__(self)


def _shown(tag: str) -> str:
    return brief_text("!!" + tag[len(_TAG):] if tag.startswith(_TAG) else tag)


def _line(mark) -> str:
    return f"line {mark.line + 1}" if mark is not None else "?"


def _scalar(node: ScalarNode):
    text, tag = node.value, node.tag
    if len(text) > MAX_NUMBER_CHARS and _number(text[:MAX_NUMBER_CHARS], "float") is not None:
        raise _Refused(f"a number of {len(text):,} characters is beyond any key's range", node.start_mark)
    if tag == _PLAIN:
        if text in _NULL:
            return None
        if text in _BOOL:
            return _BOOL[text]
        for kind in ("int", "float"):
            value = _number(text, kind)
            if value is not None:
                return value
        return text
    kind = tag[len(_TAG):] if tag.startswith(_TAG) else None
    if kind == "str":
        return text
    if kind == "null" and text in _NULL:
        return None
    if kind == "bool" and text in _BOOL:
        return _BOOL[text]
    if kind in ("int", "float"):
        value = _number(text, kind)
        if value is not None:
            return value
    raise _Refused(f"{_shown(tag)} {brief_text(text)}: not a value this reader accepts (YAML 1.2 core schema: "
                   "str, int, float, bool, null)", node.start_mark)


def _number(text: str, kind: str):
    if kind == "int":
        if _INT.fullmatch(text):
            return int(text, 10)
        if _OCT.fullmatch(text):
            return int(text[2:], 8)
        if _HEX.fullmatch(text):
            return int(text[2:], 16)
        return None
    if _FLOAT.fullmatch(text):
        return float(text)
    if _INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    if _NAN.fullmatch(text):
        return math.nan
    return None


def _value(node):
    """The Python value of a composed node (depth already bounded by the composer)."""
    if isinstance(node, ScalarNode):
        return _scalar(node)
    if isinstance(node, SequenceNode):
        if node.tag != _TAG + "seq":
            raise _Refused(f"tag {_shown(node.tag)} on a list is not accepted", node.start_mark)
        return [_value(item) for item in node.value]
    if node.tag != _TAG + "map":
        raise _Refused(f"tag {_shown(node.tag)} on a mapping is not accepted", node.start_mark)
    mapping, lines = {}, {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, ScalarNode):
            raise _Refused("a key must be a plain value, not a list or a mapping", key_node.start_mark)
        key = _scalar(key_node)
        if key in mapping:
            raise _Refused(f"key {brief(key)} appears twice in one mapping (lines {lines[key] + 1} and "
                           f"{key_node.start_mark.line + 1}); keep one", key_node.start_mark)
        mapping[key], lines[key] = _value(value_node), key_node.start_mark.line
    return mapping


def load_yaml_text(text: str, source: str):
    """The value of one YAML document (None for an empty one); raises UserError naming `source`."""
    if len(text) > MAX_BYTES:
        raise UserError(f"{source}: {len(text):,} characters; a config or sweep file is at most "
                        f"{MAX_BYTES:,}")
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        return None if node is None else _value(node)
    except _Refused as err:
        raise UserError(f"{source}: {_line(err.mark)}: {err}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        what = ", ".join(part for part in (err.context, err.problem) if part)
        raise UserError(f"{source}: not valid YAML at {_line(mark)}: {brief_text(what, 120)}") from None
    except yaml.YAMLError as err:  # the reader's own errors: a control character, bad encoding
        raise UserError(f"{source}: not valid YAML ({brief_text(str(err).splitlines()[0])})") from None
    finally:
        if loader is not None:
            loader.dispose()


def read_yaml(path: Path):
    """The YAML document in the file `path` (a regular file of at most MAX_BYTES)."""
    try:
        with open_regular(path) as file:  # refuses a FIFO or device without blocking (an OSError below)
            data = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: a directory, not a YAML file") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
    if len(data) > MAX_BYTES:
        raise UserError(f"{path}: more than {MAX_BYTES:,} bytes; a config or sweep file is far smaller")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (byte {err.start})") from None
    return load_yaml_text(text, str(path))


def brief_text(text: str, limit: int = 60) -> str:
    """`text` cut to `limit` characters, for echoing what a user wrote in a message."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def brief(value, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters: a message never echoes a whole huge value."""
    return brief_text(_bounded_repr(value, limit), limit)


def _bounded_repr(value, limit: int) -> str:
    # repr of a deep or huge structure is itself slow or recursive: build it only as far as shown
    if isinstance(value, (list, tuple, dict)):
        items = list(value.items()) if isinstance(value, dict) else list(value[:limit])
        parts, size = [], 0
        for item in items[:limit]:
            part = (f"{_bounded_repr(item[0], limit)}: {_bounded_repr(item[1], limit)}" if isinstance(value, dict)
                    else _bounded_repr(item, limit))
            parts.append(part)
            size += len(part) + 2
            if size > limit:
                break
        open_, close = ("{", "}") if isinstance(value, dict) else ("(", ")") if isinstance(value, tuple) else ("[", "]")
        more = ", ..." if len(parts) < len(value) else ""
        return f"{open_}{', '.join(parts)}{more}{close}"
    if isinstance(value, int) and value.bit_length() > 128:  # str() of a huge int is slow, then refused
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1:,} digits"
    return repr(value)


def _represent_str(dumper, text: str):
    """A string that this reader would take for a number, a boolean or null (`1e3`, `0o17`, `.5`, which YAML
    1.1 reads as strings) is quoted, so what is written reads back the same."""
    style = "'" if text and (_number(text, "int") is not None or _number(text, "float") is not None
                             or text in _BOOL or text in _NULL) else None
    return dumper.represent_scalar(_TAG + "str", text, style=style)


def _dumper(base):
    dumper = type(f"Quoting{base.__name__}", (base,), {})
    dumper.add_representer(str, _represent_str)
    return dumper


# safe_dump with _represent_str, by libyaml's emitter where PyYAML has it (~4x faster: a packed sweep writes a
# config.yaml a trial, 4.8 ms each on the GPU machine's host by Python's; a config's text is the same, a long
# escaped string may fold at another column and reads back the same) and by Python's
DUMPERS = {"python": _dumper(yaml.SafeDumper)}
if getattr(yaml, "__with_libyaml__", False):
    DUMPERS["libyaml"] = _dumper(yaml.CSafeDumper)


def dump_yaml(data) -> str:
    if "libyaml" in DUMPERS:
        try:
            return yaml.dump(data, Dumper=DUMPERS["libyaml"], sort_keys=False)
        except UnicodeEncodeError:
            pass  # a non-UTF-8 path's surrogate escapes, which libyaml cannot encode and Python's emitter writes
    return yaml.dump(data, Dumper=DUMPERS["python"], sort_keys=False)
