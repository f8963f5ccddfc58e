"""Issue 28's acceptance on the model organisms (issue 26): a depth run of the embedded SmolLM2 with a shipped
organism's adapter merged recovers where its planted behaviour lives. Depth i is the stream after decoder layer i
(0-based layer b's output is depth b + 1), so an adapter on layers b0..b1 can move nothing below depth b0 + 1.

- `gap`: E's CI covers 0 at every depth <= b0 and the departure layer is > b0; the judge patch at depths at or above
  the departure closes at least half of the gap; the foreign-scenario control closes less than a quarter.
- `no-gap`: no departure layer. `position-a`: E's CI covers 0 at every depth.
Skipped until the organisms package and its adapters are on the branch (they ship in organisms/data/<name>/)."""

import dataclasses
import os

import pandas as pd
import pytest

from readouts.driver import ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap import profile as gap_profile
from readouts.gap.study import GapStudy
from stats.core.seeding import rng_for
from stats.depth.compute import closure_estimates, departure, depth_estimates, paired_columns

SCENARIOS = 24
PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="depth-organism", max_units=SCENARIOS,
                              chunk_size=SCENARIOS, orders={"D": 4, "J0": 4, "control": 1, "raw": 1},
                              patch_orders=1, patch_stride=2)

# 24 gap-v1 scenarios per organism at every depth: tens of minutes on two cores, so outside `make test`
# (run it with LOGIT_READOUT_SLOW=1; issue 28 note).
SLOW = pytest.mark.skipif(not os.environ.get("LOGIT_READOUT_SLOW"), reason="set LOGIT_READOUT_SLOW=1 to run")


def organism_band(name: str) -> tuple[int, int]:
    organisms = pytest.importorskip("organisms")
    from organisms.recipes import organism

    if organisms.shipped_path(name) is None:
        pytest.skip(f"organism {name}: no shipped adapter in organisms/data/{name}")
    return tuple(organism(name).band)


def depth_run(name: str, out) -> tuple[pd.DataFrame, pd.DataFrame]:
    import organisms

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
        path = run_study(GapStudy(readouts="D,J0,depth"),
                         RunOptions(model=ModelOptions("smollm2-135m", adapter=str(organisms.shipped_path(name))),
                                    panel="gap-v1", profile=PROFILE.name, out=str(out), progress=False),
                         log=lambda _: None)
    return pd.read_parquet(path / "depth.parquet"), pd.read_parquet(path / "patching.parquet")


def analysed(depth: pd.DataFrame, n_boot: int = 2000):
    est = depth_estimates(depth, rng_for(0, "layers"), n_boot)
    layers, _, values = paired_columns(depth)
    dep = departure(values[:, 3, :], layers, est, rng_for(0, "departure"), n_outer=300, n_inner=300)
    e = est[est.quantity == "E"].sort_values("layer")
    return e, dep


@SLOW
@pytest.mark.smollm
@pytest.mark.parametrize("name", ["gap", "no-gap", "position-a"])
def test_depth_recovers_the_organism(name, tmp_path):
    b0, _ = organism_band(name)
    depth, patching = depth_run(name, tmp_path / name)
    e, dep = analysed(depth)
    covers = (e.low <= 0) & (e.high >= 0)
    if name == "gap":
        assert covers[e.layer <= b0].all(), e[e.layer <= b0]
        assert dep.layer is not None and dep.layer > b0, dep
        c = closure_estimates(patching, rng_for(0, "closure"), 2000)
        at = c[c.layer >= dep.layer].set_index(["source", "layer"]).closure
        assert (at.loc["judge"] >= 0.5).all(), at
        assert (at.loc["foreign_judge"] < 0.25).all(), at
    elif name == "no-gap":
        assert dep.layer is None, dep
    else:
        assert covers.all(), e[~covers]
