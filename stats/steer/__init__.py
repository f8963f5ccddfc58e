"""Steering (this project's extension; docs/steering.md): on the held-out split, E(strength) per layer with the
paired scenario bootstrap against the unsteered read, the random-direction band, the twin's p_D and J0 under the
same steering, and the capability text's loss relative to unsteered.

    compute   per-scenario quantities per condition, their estimates, the random band, the capability (pure)
    report    run_steer_report(): `readout stats` on a steering run writes the tables, the figure and the summary
    names     the files it writes (read by the HTML report)
"""

from stats.steer.names import STEER_FIGURES, STEER_MARKDOWN, STEER_OUTPUTS, STEER_TABLES
from stats.steer.report import is_steer_run, run_steer_report

__all__ = ["STEER_FIGURES", "STEER_MARKDOWN", "STEER_OUTPUTS", "STEER_TABLES", "is_steer_run", "run_steer_report"]
