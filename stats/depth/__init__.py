"""Through depth: where in the network the agent frame's answer departs from the judge frame's (this project's
extension of the gap paper; docs/depth.md).

    compute   per layer p_D, p_J0, g, E with the paired scenario bootstrap; the departure layer (nested bootstrap
              CI); the patch-closure curve of each patch source (pure)
    report    run_depth_report(): `readout stats` on a run with depth.parquet writes the tables and figures

    names     the files it writes (read by the HTML report)
"""

from stats.depth.names import DEPTH_FIGURES, DEPTH_OUTPUTS
from stats.depth.report import run_depth_report

__all__ = ["DEPTH_FIGURES", "DEPTH_OUTPUTS", "run_depth_report"]
