"""The README's two set-up commands: the first installs what running needs and trains the main job, the
second installs what testing needs and runs the tests; docs/index.md shows the same two, and .ci/run runs
them as written. (A first command that installed the test extras made an 858 MB environment where about
730 MB run everything.)"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def commands(path: Path) -> tuple[str, str]:
    lines = [line.strip() for line in path.read_text().splitlines() if line.startswith("    ")]
    first = next(line for line in lines if line.endswith("mlptrain run configs/adam_mnist.yaml"))
    tests = next(line for line in lines if line.endswith("python -m pytest -q"))
    return first, tests


def test_the_first_command_installs_only_what_running_needs():
    first, tests = commands(REPO / "README.md")
    assert 'pip install -e . &&' in first and "[dev]" not in first
    assert 'pip install -e ".[dev]" &&' in tests
    assert commands(REPO / "docs" / "index.md") == (first, tests)
    # the [project] dependencies list, read without tomllib (Python 3.11+; the project runs on 3.10)
    block = re.search(r"^dependencies = \[(.*?)^\]", (REPO / "pyproject.toml").read_text(), re.M | re.S).group(1)
    runtime = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block, re.M)
    assert "numpy" in runtime and not {"pytest", "hypothesis", "psycopg", "mkdocs"} & set(runtime)


def test_ci_installs_as_the_readme_says_then_runs_its_test_command():
    ci = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    installs = [line for line in ci if line.startswith("pip install -q -e")]
    assert installs == ["pip install -q -e .", 'pip install -q -e ".[dev]"']
    assert "python -m pytest -q" in ci
