"""Sweeps: the sweep file (`spec`), the Optuna engine that runs trials (`engine`), the results
(`report`) and `--workers` child processes (`workers`). Nothing is imported here, so reading a sweep
file does not pay for Optuna's import."""
