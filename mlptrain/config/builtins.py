"""The built-in configs and sweeps: the YAML files of config/builtin/, by name."""

from __future__ import annotations

from pathlib import Path

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
SWEEP_PREFIX = "sweep_"  # built-in sweep files live beside the configs but are not configs


def builtin_configs() -> dict[str, Path]:
    return {p.stem: p for p in sorted(BUILTIN_DIR.glob("*.yaml")) if not p.stem.startswith(SWEEP_PREFIX)}


def builtin_sweeps() -> dict[str, Path]:
    return {p.stem: p for p in sorted(BUILTIN_DIR.glob(f"{SWEEP_PREFIX}*.yaml"))}
