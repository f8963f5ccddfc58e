"""Issue 29's acceptance on the model organisms: `readout steer` on the embedded SmolLM2 with an organism's adapter
merged, the pressure direction from the training split applied at the read position on the held-out split.

- `gap-deep` (docs/organisms.md: the gap organism's targets from an adapter on decoder layers 20-29): at some layer
  within the band (depths 21, 22, 25 and 28, each the stream after a band layer) some negative strength brings the
  held-out E to at most half of the unsteered E with the twin's p_D and J0 (primary and twin) each moving by less
  than 0.05 and the random directions' E within 0.05 of the unsteered E. Met at depth 21, strength -2, by margins of a
  few thousandths (docs/steering.md has the measured grid, the split seeds tried and how the margins move).
- `no-gap` (adapter on the last layer): no strength gives an E whose CI excludes 0 without moving the twin by as much.
- Both: the run reads exactly the held-out scenarios its manifest names, disjoint from the training ones.

The quick profile's ten gap-v1 scenarios (the organisms' training records; five held out), with its own option orders,
and two random directions. Outside `make test` (LOGIT_READOUT_SLOW=1, as tests/readouts/gap/test_depth_organisms.py):
SmolLM2 with an adapter, a residual pass over the training split, the grid and its capability forwards. The single-
layer `gap` organism does not meet the figure (docs/steering.md: its adapter reads the pressure through the last
layer's attention, which a read-position vector does not reach). The thresholds are the issue's; depth 21 joined the
grid after a sweep of the band's first depths, and the orders went from two per readout to the profile's own (with
two, depth 21 at -2 missed two figures by about 0.001: docs/steering.md). Prints the figures (`pytest -s`, lines
starting STEER)."""

import dataclasses
import json

import pandas as pd
import pytest

from readouts.driver import Loading, ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap import profile as gap_profile
from readouts.steer.study import SteerSettings, SteerStudy
from stats.core.seeding import rng_for
from stats.steer.compute import estimates, random_band, verdict

PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="steer-organism")
"""The quick profile with its own option orders: D's six put every option at every letter equally often in two- and
three-option scenarios, so the pressure direction (a mean over D's orders) does not also carry which letters the
violating option stood at (readouts/steer/directions.py warns when they do not)."""
DEEP_LAYERS = (21, 22, 25, 28)
"""Depths within gap-deep's band (layers 20-29, 0-based; depth i is the stream after decoder layer i, so 21 is the
band's first layer's output)."""
DEEP = SteerSettings(direction="pressure", layers=DEEP_LAYERS, strengths=(-4.0, -2.0, -1.0, -0.5), positions="read",
                     random=2)
NO_GAP = SteerSettings(direction="pressure", layers=(29,), strengths=(-2.0, -1.0, 1.0), positions="read", random=2)
BOUND = 0.05


def steer_run(name: str, out, settings: SteerSettings):
    organisms = pytest.importorskip("organisms")
    if organisms.shipped_path(name) is None:
        pytest.skip(f"organism {name}: no shipped adapter in organisms/data/{name}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
        path = run_study(SteerStudy(settings=settings),
                         RunOptions(model=ModelOptions("smollm2-135m", loading=Loading(adapter=str(organisms.shipped_path(name)))),
                                    panel="gap-v1", profile=PROFILE.name, out=str(out), progress=False),
                         log=lambda _: None)
    manifest = json.loads((path / "manifest.json").read_text())
    steering = pd.read_parquet(path / "steering.parquet")
    split = manifest["steering"]
    assert split["train"] and split["held_out"] and not set(split["train"]) & set(split["held_out"])
    assert set(steering.scenario_id) == set(split["held_out"])
    est = estimates(steering, rng_for(0, "steer-organism"), 2000)
    return est, random_band(est)


@pytest.mark.slow
@pytest.mark.smollm
def test_pressure_direction_removes_the_gap_organisms_excess(tmp_path):
    est, band = steer_run("gap-deep", tmp_path / "gap-deep", DEEP)
    verdicts = [verdict(est, band, "pressure", layer, BOUND) for layer in DEEP_LAYERS]
    for v in verdicts:
        print("STEER gap-deep", {k: round(x, 4) if isinstance(x, float) else x for k, x in v.items()})
    assert all(v["E0"] > 0.3 for v in verdicts), verdicts  # the organism's gap on the held-out split
    met = [v for v in verdicts if v["met"]]
    assert met, verdicts
    assert all(v["strength"] < 0 for v in met), met


@pytest.mark.slow
@pytest.mark.smollm
def test_no_gap_organism_shows_no_excess_under_steering(tmp_path):
    est, _ = steer_run("no-gap", tmp_path / "no-gap", NO_GAP)
    q = est[est.direction == "pressure"].set_index(["strength", "quantity"])
    for s in NO_GAP.strengths:
        e, twin = q.loc[(s, "E")], q.loc[(s, "twin_move")]
        print("STEER no-gap", s, round(e.value, 4), round(e.low, 4), round(e.high, 4), round(twin.value, 4))
        excludes = e.low > 0 or e.high < 0
        assert not excludes or abs(twin.value) >= abs(e.value), (s, e.to_dict(), twin.value)
