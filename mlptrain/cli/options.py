"""Option values the commands parse themselves, so that a bad one is one line (Click's own type errors
print a usage block)."""

from __future__ import annotations

from pathlib import Path

from mlptrain.config.safe_yaml import brief_text
from mlptrain.errors import UserError
from mlptrain.run_dirs.lock import LOCK_NAME

MAX_INT = 2**31 - 1  # what liblinear's iteration count and a batch's rows (int32 offsets) can hold


def positive_int(text: str, flag: str, maximum: int = MAX_INT) -> int:
    shown = brief_text(text, 40)
    try:
        value = int(text) if len(text) < 40 else None
    except ValueError:
        value = None
    if value is None:
        raise UserError(f"{flag} {shown}: not an integer; give one in [1, {maximum:,}]") from None
    if not 1 <= value <= maximum:
        raise UserError(f"{flag} {shown}: must be in [1, {maximum:,}]")
    return value


# the records of a run, a --seeds group or a sweep (their folders hold config.yaml, seeds.json or
# results.json): never replaced by a command's output, --force or not
RUN_RECORDS = ("config.yaml", "summary.json", "metrics.jsonl", "metrics.csv", "grad_norms.npy", LOCK_NAME,
               "seeds.json", "seeds-plan.json", "results.json", "results.csv", "study.journal", "study.db")


def new_output(path: Path, force: bool, reads: tuple = ()) -> Path:
    """`path` may be written: its folder exists, it is not a folder, it is none of the files the command
    `reads` nor a run's own record or checkpoint, and it does not exist unless `force` (results are not
    replaced without a word)."""
    if path.is_dir():
        raise UserError(f"--out {path}: is a directory; name a file in it")
    if not path.parent.is_dir():
        raise UserError(f"--out {path}: no such directory {path.parent}")
    if path.exists() and not path.is_file():  # an output replaces its file by a rename: never /dev/null's
        raise UserError(f"--out {path}: not a regular file (a device, pipe or socket); name a file")
    for source in (Path(r) for r in reads if r is not None):
        if path.resolve() == source.resolve() or (path.exists() and source.exists() and path.samefile(source)):
            raise UserError(f"--out {path}: is {source}, which this command reads; name another file")
    folder = path.resolve().parent
    run = folder.parent if folder.name == "checkpoints" else folder
    marked = [name for name in ("config.yaml", "seeds.json", "results.json") if (run / name).is_file()]
    if marked and (run != folder and marked[0] == "config.yaml" or path.name in RUN_RECORDS
                   or path.name.startswith("events.out.tfevents")):
        raise UserError(f"--out {path}: one of the records or checkpoints of {run}, which are never "
                        "replaced; name another file")
    if (path.exists() or path.is_symlink()) and not force:  # a dangling link is a name taken too
        raise UserError(f"{path} exists; add --force to overwrite it, or --out another file")
    return path


BACKEND_HELP = "where the model runs: cpu (the default), cuda or auto"


def backend_name(text: str) -> str:
    """The --backend of evaluate, predict and extract-features, refused in the option's own words: a config's
    `backend=cuda` refusal would name the config key, which these commands do not take."""
    if text not in ("cpu", "cuda", "auto"):
        raise UserError(f"--backend {text}: use cpu, cuda or auto")
    if text == "cuda":
        # imported when asked for: the CPU path of these commands never loads the backend module's CUDA checks
        from mlptrain.backends.cuda import cuda_unusable_reason

        reason = cuda_unusable_reason()
        if reason is not None:
            raise UserError(f"--backend cuda: no usable NVIDIA GPU or CUDA driver ({reason}); use --backend cpu "
                            "or --backend auto")
    return text
