"""The judgment-action gap paper's statistics over a run's scenarios.parquet.

    names           the contract's cells, readouts and frames by the role each plays here
    tables          load_run / Run: the table read as contract.tables.SCENARIOS declares it; pool_runs (--pool)
    screen          the screen (Table 13), the mass floor, the strictness ladder's reference levels
    continuous      p_D, p_J, g, the paired excess E, the paraphrase floor, the selection-matched null
    binary          the binary gap, its matched null and paired excess, each on its own set, the known-gap band
    nested          the binary readout's one bootstrap (scenarios, then rollouts from each order's exact distribution)
    slices          g, the binary gap, their nulls and excesses by family, generator, family x generator, prompt
                    version; F5 also against its harm-matched twin
    harness         the harness calibration table (anchor-rule and forced shares) from probes.parquet
    paraphrase      the F4 paraphrase swap (Table 14)
    control         the known-gap control move and its validation bar
    dose            the dose arm's paired contrasts (Table 8)
    raw             the raw completion frame, the chat-vs-raw bridge, the three-cell contrast
    analysis        analyze(): every analysis a run allows, as data (RunAnalysis)
    report          run_report(): `readout stats`, writes tables, figures and report.md
    compare         compare(): the cross-run analyses as data (roles, sweep, three-cell, bridges)
    compare_report  compare_runs(): `readout compare`, writes them
    figures         the paper's figures
    synthetic       run directories with planted effects (tests, benchmarks)

Compute modules are pure; `report` and `compare_report` write.
"""

from stats.gap.analysis import FloorRow, RunAnalysis, Skipped, analyze
from stats.gap.compare import Comparison, RecipeRow, Role, compare, role_of
from stats.gap.compare_report import compare_runs
from stats.gap.report import headline, run_report
from stats.gap.screen import DEFAULT_MASS_FLOOR, GATE_FAMILIES, LEVELS, verdict_level
from stats.gap.synthetic import SyntheticSpec, make_run_dir, screened_values, simulate_tables
from stats.gap.tables import Run, load_run

__all__ = [
    "FloorRow", "RunAnalysis", "Skipped", "analyze", "Comparison", "RecipeRow", "Role", "compare", "role_of",
    "compare_runs", "headline", "run_report", "DEFAULT_MASS_FLOOR", "GATE_FAMILIES", "LEVELS", "verdict_level",
    "SyntheticSpec", "make_run_dir", "screened_values", "simulate_tables", "Run", "load_run",
]
