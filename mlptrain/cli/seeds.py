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


def run_seeds(path: Path, overrides: list[str], seeds_text: str, runs_dir: Path, name: str | None,
              pack: int | str = 1) -> None:
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.seeds.report import seeds_table
    from mlptrain.seeds.results import load_result
    from mlptrain.seeds.runner import parse_seeds
    from mlptrain.packing.side_by_side import check_pack
    from mlptrain.seeds.runner import run_seeds as train_seeds

    seeds = parse_seeds(seeds_text)
    pack = check_pack(pack)
    if any(parse_override(text)[0] == "seed" for text in overrides):
        raise UserError("--seeds sets each run's seed; drop the seed= override")
    config = load_config(path, overrides)
    if name is not None:
        check_run_name(name)
        _not_an_unfinished_group(runs_dir / name)
    with StopOnSignal() as stop:
        group, _ = train_seeds(config, seeds, runs_dir, name, path.stem, Resources(), stop, pack)
    console.print(seeds_table(seeds, load_result(group).metrics))
    console.print(f"{len(seeds)} runs and seeds.json written to {group} (compare with: mlptrain compare {group} "
                  "OTHER)", highlight=False, soft_wrap=True)


def finish_seeds(group: Path, overrides: list[str]) -> None:
    """`mlptrain run --resume GROUP_DIR`: finish an interrupted seed group (mlptrain.seeds.finish), then the
    same table as `--seeds`."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.seeds.finish import finish_group
    from mlptrain.seeds.report import seeds_table
    from mlptrain.seeds.results import load_result

    with StopOnSignal() as stop:
        seeds, _ = finish_group(group, overrides, Resources(), stop)
    console.print(seeds_table(seeds, load_result(group).metrics))
    console.print(f"{len(seeds)} runs and seeds.json in {group} (compare with: mlptrain compare {group} OTHER)",
                  highlight=False, soft_wrap=True)


def _not_an_unfinished_group(folder: Path) -> None:
    """Re-running an interrupted `--seeds` command under its --name: say how to finish that group."""
    # the command's own modules, imported when it runs: --help and the other commands start without them
    from mlptrain.seeds.finish import is_group

    if is_group(folder) and not (folder / "seeds.json").is_file():
        raise UserError(f"{folder}: an unfinished seed group of that name exists; finish it with mlptrain run "
                        f"--resume {folder}, or choose another --name")
