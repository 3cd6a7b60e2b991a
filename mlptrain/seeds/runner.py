"""`mlptrain run CONFIG --seeds N`: one run per seed, one after another in this process (or `--pack K` of them
side by side), then seeds.json.

The runs share the process's backend and dataset (mlptrain.training.experiment.Resources) and, on a GPU, the
kernels compiled for the first. `NAME/seed-S/` is an ordinary run directory (resume it, extract its
features); `NAME/seeds.json` holds each final metric's values over the seeds, their mean, standard
deviation and 95% confidence interval (Student t), and is written only once every seed has finished;
`NAME/seeds-plan.json`, written first, lets `mlptrain run --resume NAME` finish an interrupted group
(mlptrain.seeds.finish).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from contextlib import contextmanager
from pathlib import Path

from mlptrain.config.load import config_to_dict
from mlptrain.config.schema import INT64_MAX, Config
from mlptrain.errors import UserError
from mlptrain.run_dirs.folders import create_run_dir
from mlptrain.run_dirs.records import write_json
from mlptrain.seeds.results import HIGHER_IS_BETTER, PLAN, final_metrics
from mlptrain.seeds.statistics import CONFIDENCE, spread
from mlptrain.training.experiment import Resources, create_run, whole_or_removed
from mlptrain.training.loop import training
from mlptrain.packing.auto import resolve
from mlptrain.packing.lane_group import slots
from mlptrain.packing.side_by_side import NoRoom, room_for, side_by_side
from mlptrain.training.steps import finish
from mlptrain.util.console import console

MAX_SEEDS = 1000
MAX_SEED = INT64_MAX  # the config's own bound on `seed`


def parse_seeds(text: str) -> list[int]:
    """`--seeds 5` -> [0, 1, 2, 3, 4]; `--seeds 0,3,7` -> [0, 3, 7]. At least two distinct seeds (a
    spread needs two); raises UserError."""
    parts = [part.strip() for part in text.split(",")]
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        raise UserError(f"--seeds {text}: give a count (--seeds 5: seeds 0 to 4) or a list of seeds "
                        "(--seeds 0,3,7)") from None
    if len(numbers) == 1:
        count = numbers[0]
        if not 2 <= count <= MAX_SEEDS:
            raise UserError(f"--seeds {text}: a count of seeds must be 2 to {MAX_SEEDS} (a spread needs two runs; "
                            "for one, drop --seeds)")
        return list(range(count))
    if any(not 0 <= seed <= MAX_SEED for seed in numbers):
        raise UserError(f"--seeds {text}: each seed must be 0 to {MAX_SEED}")
    if len(set(numbers)) != len(numbers):
        raise UserError(f"--seeds {text}: a seed is listed twice; each seed runs once")
    if len(numbers) > MAX_SEEDS:
        raise UserError(f"--seeds {text}: at most {MAX_SEEDS} seeds")
    return numbers


def run_seeds(config: Config, seeds: list[int], runs_dir: Path, name: str | None, stem: str,
              resources: Resources, stop=None, pack: int | str = 1) -> tuple[Path, dict]:
    """Train `config` once per seed in `runs_dir/NAME/seed-S/` and write `NAME/seeds.json`; returns
    (NAME's path, the seeds record). Every session is built before its directory is created; a seed that
    fails or is interrupted raises, leaving the finished seeds' runs and no seeds.json. `pack`: that many
    seeds train side by side from this thread (mlptrain.packing.side_by_side), each on a stream of its own ("auto":
    as many as mlptrain.packing.auto measures); a seed's failure then stops the others after their step
    (each keeps a checkpoint to resume from)."""
    group, summaries, queue = [], {}, deque(enumerate(seeds))
    pack = resolve(pack, config, resources, len(seeds))

    def seed_runs(view, give_way=False):  # this slot's seeds, one after another, taken from the shared queue
        while queue:
            i, seed = queue.popleft()
            try:
                summaries[seed] = yield from _seed_run(config, seed, i, seeds, runs_dir, name, stem, view, group,
                                                       stop, pack == 1, give_way)
            except NoRoom as err:  # another slot takes it once one of the seeds beside it has finished
                queue.appendleft((i, seed))
                console.print(f"[yellow]warning:[/] seed {seed} does not fit beside the seeds training already "
                              f"({err}); it waits for one of them, and one seed fewer trains at once",
                              highlight=False)
                return

    if pack == 1:
        finish(seed_runs(resources))
    else:
        lanes, views = slots(config, resources, min(pack, len(seeds)))
        side_by_side([seed_runs(view, i > 0) for i, view in enumerate(views)], stop, lanes)
    record = seeds_record(seeds, [summaries[seed] for seed in seeds])
    write_json(group[0] / "seeds.json", record)
    return group[0], record


def _seed_run(config: Config, seed: int, i: int, seeds: list[int], runs_dir: Path, name: str | None, stem: str,
              resources: Resources, group: list, stop, progress: bool, give_way: bool):
    """One seed's run as training steps (mlptrain.training.loop.training); the first to start makes the group's
    folder and plan (`group`, a list that then holds the folder). `give_way`: as packing.room_for's."""
    seeded = dataclasses.replace(config, seed=seed)
    with room_for(give_way):
        session = resources.session(seeded, start_compilers=True)
    if not group:
        group.append(create_run_dir(runs_dir, name, stem))
        write_json(group[0] / PLAN, {"seeds": list(seeds), "config": config_to_dict(config)})
    console.print(f"[bold]seed {seed}[/] ({i + 1} of {len(seeds)})")
    run_dir = create_run(seeded, group[0], f"seed-{seed}", stem)
    with seed_named(seed), whole_or_removed(run_dir, new=True):
        return (yield from training(session, run_dir, stop=stop, progress=progress))


@contextmanager
def seed_named(seed: int):
    """A seed's failure says which seed (`seed 3: ...`); an interrupted run's own line names its directory
    already."""
    try:
        yield
    except UserError as err:
        if getattr(err, "exit_code", 2) == 2:
            raise type(err)(f"seed {seed}: {err}") from None
        raise


def seeds_record(seeds: list[int], summaries: list[dict]) -> dict:
    """What seeds.json holds: the seeds, their run directories, the dataset, and for each final metric every
    seed has, its values and their mean, standard deviation and confidence interval."""
    finals = [final_metrics(summary) for summary in summaries]
    names = [key for key in finals[0] if all(key in f for f in finals)]
    metrics = {}
    for key in names:
        s = spread([f[key] for f in finals])
        metrics[key] = {"mean": s.mean, "std": s.std, "ci": list(s.interval), "half_width": s.half_width,
                        "higher_is_better": HIGHER_IS_BETTER.get(key, False), "values": list(s.values)}
    return {"seeds": list(seeds), "runs": [summary["run"] for summary in summaries],
            "confidence": CONFIDENCE, "interval": "Student t over the seeds (n - 1 degrees of freedom)",
            "dataset": summaries[0]["dataset"], "metrics": metrics}
