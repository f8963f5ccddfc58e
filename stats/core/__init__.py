"""The shared core of both papers' statistics: errors, estimates, seeding, bootstraps, table reading,
CSV/Markdown writing and the figure convention.

    errors      StatsInputError, the one root every bad-input error derives from (and its subclasses)
    estimate    Estimate (value, n, CI, SE, detection bar) and its constructors
    seeding     rng_for: a Generator per named analysis (SPAWN for the gap paper, ENTROPY for the NSI paper)
    bootstrap   scenario bootstrap (paired), nested majority bootstrap, cluster CI, nested binomial CI
    tables      read_table / conform: a run table read and typed as contract.tables declares it
    output      write_csv, md_table, frame_markdown, md_section, write_table, cell/num formatting
    figures     new_figure / save: matplotlib's object API on an Agg canvas (no pyplot), shared palette

The error types are imported at once (the CLI catches them at start-up); everything else on first use,
so that importing `stats.core.errors` does not load scipy, pyarrow or matplotlib.
"""

from __future__ import annotations

import importlib

from stats.core.errors import CompareError, NSITableError, RunDirError, StatsInputError, TableSchemaError, TableValueError

_LAZY = {
    "Estimate": "estimate", "MDE_FACTOR": "estimate", "as_float": "estimate", "empty": "estimate",
    "make_estimate": "estimate",
    "ENTROPY": "seeding", "SPAWN": "seeding", "name_key": "seeding", "rng_for": "seeding",
    "cluster_ci": "bootstrap", "estimates_from": "bootstrap", "majority_prob_from_fraction": "bootstrap",
    "nested_binomial_ci": "bootstrap", "nested_binomial_draws": "bootstrap", "nested_majority": "bootstrap", "percentile_ci": "bootstrap",
    "scenario_bootstrap": "bootstrap",
    "conform": "tables", "read_table": "tables",
    "GAP_FLOAT_FORMAT": "output", "cell": "output", "frame_markdown": "output", "md_section": "output",
    "md_table": "output", "md_value": "output", "num": "output", "rows_frame": "output", "write_csv": "output",
    "write_table": "output",
    "DPI": "figures", "colormap": "figures", "new_figure": "figures", "save": "figures",
}

__all__ = ["CompareError", "NSITableError", "RunDirError", "StatsInputError", "TableSchemaError", "TableValueError",
           *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"stats.core.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stats.core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
