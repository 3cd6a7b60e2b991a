"""`mlptrain run --resume GROUP_DIR`: finish a seed group that `--seeds` left unfinished (Ctrl-C, a crash).

A group records its plan when it starts (`seeds-plan.json`: the seeds and the config). Finishing it takes
each planned seed in turn: a seed whose run finished is kept as it is, one with a checkpoint is resumed
(bitwise where it would have ended), one whose folder has no checkpoint yet trains afresh in that folder,
and one with no folder is started; then seeds.json is written, as `--seeds` would have. A group started
before plans were recorded is finished over the seeds it has folders for, which is said once.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from mlptrain.config.load import config_from_dict, load_config
from mlptrain.errors import UserError
from mlptrain.run_dirs.links import check_no_links
from mlptrain.run_dirs.lock import lock_run
from mlptrain.run_dirs.records import write_json
from mlptrain.seeds.results import PLAN, read_json, summary_result
from mlptrain.seeds.runner import seed_named, seeds_record
from mlptrain.training.experiment import Resources, create_run
from mlptrain.training.loop import train
from mlptrain.training.resume import prepare_resume
from mlptrain.training.session import build_session
from mlptrain.util.console import console
from mlptrain.util.regular_file import read_regular_text


def is_group(path: Path) -> bool:
    """Whether `path` is the folder of a seed group (`--seeds`) rather than a run."""
    return path.is_dir() and not (path / "config.yaml").exists() and (
        (path / PLAN).is_file() or any(path.glob("seed-*/config.yaml")))


def _plan(group: Path) -> tuple[list[int], dict | None]:
    """(the group's seeds, its config as a dict, or None when no plan was recorded)."""
    if (group / PLAN).is_file():
        try:
            plan = json.loads(read_regular_text(group / PLAN))
            seeds, config = plan["seeds"], plan["config"]
            if not (isinstance(seeds, list) and seeds and all(type(s) is int for s in seeds)
                    and isinstance(config, dict)):
                raise ValueError("seeds or config")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:  # RecursionError: nested deeply
            raise UserError(f"{group / PLAN}: not the plan `--seeds` writes ({type(err).__name__}: {err})") from None
        return seeds, config
    folders = [p.name.removeprefix("seed-") for p in group.glob("seed-*") if (p / "config.yaml").is_file()]
    return sorted(int(s) for s in folders if s.isdigit()), None


def finish_group(group: Path, overrides: list[str], resources: Resources, stop=None) -> tuple[list[int], dict]:
    """Finish the seed group in `group` (see the module) and write its seeds.json; returns (its seeds, the
    seeds record). Raises UserError before anything is trained when there is nothing to finish."""
    if overrides:
        raise UserError(f"--resume {group} finishes the seed group as it was started; drop "
                        f"{' '.join(overrides)}")
    check_no_links(group, "seed group")  # a seed-N linked to another run would be finished and counted as its own
    if (group / "seeds.json").is_file():
        raise UserError(f"--resume {group}: every seed has finished and seeds.json is written; nothing to resume "
                        f"(mlptrain compare {group} OTHER compares it)")
    seeds, config = _plan(group)
    if config is None:
        console.print(f"note: {group} has no {PLAN} (started by an earlier version): finishing the seeds it "
                      f"has folders for ({', '.join(map(str, seeds))})", highlight=False)
    summaries = []
    for i, seed in enumerate(seeds):
        run_dir = group / f"seed-{seed}"
        if (run_dir / "summary.json").is_file():
            check_no_links(run_dir)
            summaries.append(_finished_summary(run_dir / "summary.json"))
            continue
        console.print(f"[bold]seed {seed}[/] ({i + 1} of {len(seeds)})")
        summaries.append(_finish_seed(run_dir, seed, config, resources, stop))
    record = seeds_record(seeds, summaries)
    write_json(group / "seeds.json", record)
    return seeds, record


def _finished_summary(path: Path) -> dict:
    """A finished seed's summary.json, read back as `compare` reads one: what seeds.json takes from it (the run,
    the dataset, the final metrics as finite numbers in range) must be there; raises UserError."""
    summary = read_json(path)
    if not isinstance(summary.get("run"), str):
        raise UserError(f"{path}: no 'run' name; not a summary.json as mlptrain writes it")
    summary_result(path, summary)  # the dataset record and the final metrics, finite numbers in range
    return summary


def _finish_seed(run_dir: Path, seed: int, config: dict | None, resources: Resources, stop) -> dict:
    with seed_named(seed):
        if (run_dir / "checkpoints" / "last.npz").is_file():
            cfg, start = prepare_resume(run_dir, [])
            session = build_session(cfg, *resources.prepare(cfg, start_compilers=True))
            return train(session, run_dir, resume=start, stop=stop)
        if (run_dir / "config.yaml").is_file():  # stopped before its first checkpoint: afresh, in its folder
            check_no_links(run_dir)
            lock_run(run_dir, "--resume")
            cfg = load_config(run_dir / "config.yaml")
            return train(build_session(cfg, *resources.prepare(cfg, start_compilers=True)), run_dir, stop=stop)
        seeded = dataclasses.replace(config_from_dict(config), seed=seed)
        session = build_session(seeded, *resources.prepare(seeded, start_compilers=True))
        return train(session, create_run(seeded, run_dir.parent, run_dir.name, "seed"), stop=stop)
