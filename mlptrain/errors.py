"""The exceptions a user may see, each printed by the CLI as one clear line (no traceback)."""


class UserError(Exception):
    """Bad input (config, flags, data, checkpoints): printed as one line, exit code 2."""


class DataNotFound(UserError):
    """A dataset neither on disk nor downloadable: which files to put where, printed on its few lines
    (the one error kept on several; every value in it is on one line)."""

    multiline = True


class OutOfMemory(UserError):
    """A run needs more GPU or host memory than is free now (refused before it allocates, or its allocation
    failed): a packed worker then trains fewer trials at once (mlptrain.sweep.engine.work_packed)."""


class TrainingDiverged(UserError):
    """The loss or the parameters became NaN or infinite; the last good checkpoint is kept."""


class TrainingInterrupted(UserError):
    """Training stopped on a signal after writing a resumable checkpoint; exits 128 + the signal number
    (130 for Ctrl-C), as a shell reports a process killed by it."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


def problems_error(problems: list[str], source: str = "") -> UserError:
    """One UserError naming every problem of one input (a config, a sweep file, the overrides): the problem
    as it is when there is one, else `SOURCE: N problems: a; b` with each problem's own `SOURCE: ` dropped
    (or `N problems in SOURCE: ...` when the problems do not start with it). An input fixed one mistake per
    run took as many runs as it had mistakes."""
    if len(problems) == 1:
        return UserError(problems[0])
    prefix = f"{source}: "
    if source and all(problem.startswith(prefix) for problem in problems):
        return UserError(f"{prefix}{len(problems)} problems: " + "; ".join(p.removeprefix(prefix) for p in problems))
    return UserError(f"{len(problems)} problems{f' in {source}' if source else ''}: " + "; ".join(problems))


class OutputClosed(BaseException):
    """The reader of stdout or stderr has gone (`mlptrain run ... | head -1`, a closed terminal): nothing can be
    said any more, so the command ends as a process killed by SIGPIPE ends (exit 141), leaving every folder it
    was making whole or removed. A BaseException, as KeyboardInterrupt is, so that no handler of ordinary
    errors on the way (an OSError's "cannot write to the run") takes it for another failure."""

    exit_code = 141  # 128 + SIGPIPE
