"""Sweep files and the small sweeps the Sweeps page starts."""
from __future__ import annotations

import pandas as pd


# ------------------------------------------------------------------ sweeps
def read_sweep(path: str) -> tuple[pd.DataFrame, dict]:
    from sim.search.sweep import read_sweep as _rs

    return _rs(path)


def sweep_param_columns(df: pd.DataFrame) -> list[str]:
    from sim.search.sweep import param_columns

    return param_columns(df)


def param_name(column: str) -> str:
    from sim.search.sweep import param_column

    prefix = param_column("")
    return column[len(prefix):] if column.startswith(prefix) else column


def run_small_sweep(trace: str, policy: str, grid_specs: list[str], max_configs: int, model: str | None,
                    hardware: str, seed: int = 0, target: dict | None = None) -> pd.DataFrame:
    """A sweep from the page: the CLI's grid parser and validation, the local backend, in memory; ``target``: the
    page's precision pickers (:func:`app.ui_backend.simulation.target_kwargs`)."""
    from app.ui_backend.simulation import target_kwargs
    from sim.search.grid import parse_grids
    from sim.search.sweep import SweepOptions, default_evaluate, run_sweep, validate_params

    grid = parse_grids(grid_specs, max_configs=max_configs)
    configs = list(grid.configs())
    validate_params(policy, configs)
    opts = SweepOptions(model_preset=model, hardware=hardware, seed=int(seed),
                        deployment=target_kwargs(target) or None)
    return run_sweep(trace, policy, configs, opts, evaluate=default_evaluate(), backend="local", progress=False)


def pareto(df: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    from sim.search.pareto import frontier

    return frontier(df, x, y)


def default_minimise(metric: str) -> bool:
    from sim.search.pareto import default_minimise as _dm

    return _dm(metric)
