"""`mlptrain run CONFIG --seeds N|S,S,...`: the config trained once per seed in one process (see
mlptrain.seeds.runner), then the table of each final metric over the seeds."""

from __future__ import annotations

from pathlib import Path

from mlptrain.cli.signals import StopOnSignal
from mlptrain.config.load import load_config, parse_override
from mlptrain.errors import UserError
from mlptrain.run_dirs.folders import check_run_name
from mlptrain.training.experiment import Resources
from mlptrain.util.console import console


def run_seeds(path: Path, overrides: list[str], seeds_text: str, runs_dir: Path, name: str | None) -> None:
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.seeds.report import seeds_table
    from mlptrain.seeds.results import load_result
    from mlptrain.seeds.runner import parse_seeds
    from mlptrain.seeds.runner import run_seeds as train_seeds

    seeds = parse_seeds(seeds_text)
    if any(parse_override(text)[0] == "seed" for text in overrides):
        raise UserError("--seeds sets each run's seed; drop the seed= override")
    config = load_config(path, overrides)
    if name is not None:
        check_run_name(name)
    with StopOnSignal() as stop:
        group, _ = train_seeds(config, seeds, runs_dir, name, path.stem, Resources(), stop)
    console.print(seeds_table(seeds, load_result(group).metrics))
    console.print(f"{len(seeds)} runs and seeds.json written to {group} (compare with: mlptrain compare {group} "
                  "OTHER)", highlight=False, soft_wrap=True)
