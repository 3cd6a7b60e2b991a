"""One experiment: a validated config, the backend and data it needs, and its run directory.

`mlptrain run` trains one experiment; a sweep trains many in one process, so
`Resources` keeps each backend and dataset once and the trials share them (and,
on the GPU, numba's compiled kernels with them).
"""

from __future__ import annotations

from pathlib import Path

from mlptrain.backend import cuda_usable, get_backend
from mlptrain.config import Config, config_to_dict
from mlptrain.data import load_dataset
from mlptrain.data.loader import check_val_size
from mlptrain.run_lock import lock_run
from mlptrain.runs import create_run_dir, write_yaml


class Resources:
    """Backends by name and datasets by (name, root), loaded on first use."""

    def __init__(self):
        self._backends = {}
        self._datasets = {}

    def dataset(self, config: Config):
        """The config's dataset, checked against data.val_size; raises UserError."""
        key = (config.data.dataset, config.data.root)
        if key not in self._datasets:
            root = Path(config.data.root) if config.data.root else None
            self._datasets[key] = load_dataset(config.data.dataset, root)
        check_val_size(self._datasets[key], config.data.val_size)
        return self._datasets[key]

    def prepare(self, config: Config, start_compilers: bool = False):
        """(backend, dataset) for `config`; raises UserError. start_compilers: on a GPU with no compiled
        kernels yet, start the compile workers before loading the data (a run that will train)."""
        if config.backend not in self._backends:
            self._backends[config.backend] = get_backend(config.backend)
            if start_compilers:
                self._backends[config.backend].start_compilers()
        return self._backends[config.backend], self.dataset(config)


def check_inputs(config: Config) -> None:
    """What `Resources.prepare` checks, without starting a GPU context: for a process that only
    starts workers, which take the GPUs."""
    if config.backend == "cuda" and not cuda_usable():
        get_backend("cuda")  # raises its one-line reason
    Resources().dataset(config)


def create_run(config: Config, runs_dir: Path, name: str | None, stem: str, suffix_on_clash: bool = False) -> Path:
    """The new run directory, locked for this process and holding the resolved config (see
    `create_run_dir` for the name)."""
    run_dir = create_run_dir(runs_dir, name, stem, suffix_on_clash)
    lock_run(run_dir, "the run")  # held while this process works in it
    write_yaml(run_dir / "config.yaml", config_to_dict(config))
    return run_dir
