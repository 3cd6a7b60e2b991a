"""Every `mlptrain ...` example in the README and the docs is one the command line takes as written: its
command and options exist, its configs, sweeps and overrides load. A synopsis line (`RUN_DIR`,
`[--out FILE]`) is not an example. The features walk-through, whose second SVM once refused to replace
the first's report, is run as written in tests/cli/test_doc_walkthrough.py."""

import re
import shlex
from pathlib import Path

import pytest
import typer

from mlptrain.cli import CLICK_ERROR, app
from mlptrain.config.builtins import builtin_configs, builtin_sweeps
from mlptrain.config.load import load_config
from mlptrain.sweep.spec import load_sweep

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# an upper-case word, a bracketed option or alternatives: a synopsis, not an example
SYNOPSIS = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\[-|\[[A-Z]|\w\|\w")


def examples() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if not line.startswith("    mlptrain ") or SYNOPSIS.search(line.split("#")[0]):
                continue
            found.append((f"{page.relative_to(REPO)}:{number}", shlex.split(line, comments=True)[1:]))
    return found


EXAMPLES = examples()


def test_the_pages_have_examples():
    assert len(EXAMPLES) >= 30, [where for where, _ in EXAMPLES]


@pytest.mark.parametrize("where, args", EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_an_example_is_one_the_command_line_takes(where, args):
    command, context, rest, name = typer.main.get_command(app), None, list(args), "mlptrain"
    try:
        # down the groups (mlptrain, then configs) to the command, which parses its own options and arguments
        while hasattr(command, "get_command") and rest and not rest[0].startswith("-"):
            context = command.context_class(command, info_name=name, parent=context)
            name = rest.pop(0)
            command = command.get_command(context, name)
            assert command is not None, f"{where}: no command {name}"
        sub = command.make_context(name, rest, parent=context)
    except CLICK_ERROR as err:  # Typer's own Click
        pytest.fail(f"{where}: mlptrain {shlex.join(args)}: {err.format_message()}")
    params = sub.params
    if name in ("run", "warmup") and params.get("config") and not params.get("resume"):
        _loads_as_config(params["config"], params.get("overrides") or [], where)
    elif name == "sweep":
        load_sweep(_named(params["sweep_file"], builtin_sweeps()), params.get("overrides") or [])
    elif name in ("show", "copy"):  # mlptrain configs show|copy NAME
        known = {**builtin_configs(), **builtin_sweeps()}
        assert args[2] in known, f"{where}: no built-in config or sweep named {args[2]}"


def _loads_as_config(config: str, overrides: list[str], where: str) -> None:
    if config.endswith(".yaml") and not (REPO / config).is_file():
        assert config == "adam_mnist.yaml", f"{where}: {config} is neither in the repository nor made by an example"
        config = "configs/adam_mnist.yaml"  # what `mlptrain configs copy adam_mnist` writes
    load_config(_named(config, builtin_configs()), overrides)


def _named(name: str, builtins: dict) -> Path:
    return REPO / name if (REPO / name).is_file() else builtins[name]
