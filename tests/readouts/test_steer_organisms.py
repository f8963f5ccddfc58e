"""Issue 29's acceptance on the model organisms: `readout steer` on the embedded SmolLM2 with the `gap` or `no-gap`
adapter merged (docs/organisms.md: LoRA on the last decoder layer, so depth 29, the stream entering it, is the
adapter's band), the pressure direction from the training split applied at the read position on the held-out split.

- `gap`: subtracting the pressure direction (a negative strength) brings the held-out E to at most half of the
  unsteered E, with the twin's p_D and J0 (primary and twin) each moving by less than 0.05 and the random directions'
  E within 0.05 of the unsteered E; adding it (a positive strength) does not lower E.
- `no-gap`: no strength gives an E whose CI excludes 0 without moving the twin by as much.
- Both: the run reads exactly the held-out scenarios its manifest names, disjoint from the training ones.

The quick profile's ten gap-v1 scenarios (the organisms' training records; five held out), two option orders per
readout, one layer, three strengths, two random directions. Outside `make test` (LOGIT_READOUT_SLOW=1, as
tests/readouts/test_depth_organisms.py): SmolLM2 with an adapter, a residual pass over the training split, the grid
and ten capability forwards. Not yet run to completion: in the session that wrote it the machine's two cores were
shared at a load average of 10-12 and the run did not finish (docs/steering.md); the layer and thresholds are the
issue's, not fitted to a measurement."""

import dataclasses
import json
import os

import pandas as pd
import pytest

from readouts.driver import ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap import profile as gap_profile
from readouts.steer.study import SteerSettings, SteerStudy
from stats.core.seeding import rng_for
from stats.steer.compute import estimates, random_band, verdict

PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="steer-organism",
                              orders={"D": 2, "J0": 2, "control": 1, "raw": 1})
LAYER = 29
SETTINGS = SteerSettings(direction="pressure", layers=(LAYER,), strengths=(-2.0, -1.0, 1.0), positions="read", random=2)
BOUND = 0.05
SLOW = pytest.mark.skipif(not os.environ.get("LOGIT_READOUT_SLOW"), reason="set LOGIT_READOUT_SLOW=1 to run")


def steer_run(name: str, out):
    organisms = pytest.importorskip("organisms")
    if organisms.shipped_path(name) is None:
        pytest.skip(f"organism {name}: no shipped adapter in organisms/data/{name}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
        path = run_study(SteerStudy(settings=SETTINGS),
                         RunOptions(model=ModelOptions("smollm2-135m", adapter=str(organisms.shipped_path(name))),
                                    panel="gap-v1", profile=PROFILE.name, out=str(out), progress=False),
                         log=lambda _: None)
    manifest = json.loads((path / "manifest.json").read_text())
    steering = pd.read_parquet(path / "steering.parquet")
    split = manifest["steering"]
    assert split["train"] and split["held_out"] and not set(split["train"]) & set(split["held_out"])
    assert set(steering.scenario_id) == set(split["held_out"])
    est = estimates(steering, rng_for(0, "steer-organism"), 2000)
    return est, random_band(est)


@SLOW
@pytest.mark.smollm
def test_pressure_direction_removes_the_gap_organisms_excess(tmp_path):
    est, band = steer_run("gap", tmp_path / "gap")
    v = verdict(est, band, "pressure", LAYER, BOUND)
    assert v["E0"] > 0.3, v  # the organism's gap on the held-out split
    assert v["strength"] < 0 and v["halved"], v
    assert v["twin_kept"] and v["judgment_kept"], v
    assert v["random_within"], v
    e = est[(est.direction == "pressure") & (est.quantity == "E")].set_index("strength").value
    assert e.loc[1.0] >= v["E0"] - BOUND, e  # adding the direction does not remove the gap


@SLOW
@pytest.mark.smollm
def test_no_gap_organism_shows_no_excess_under_steering(tmp_path):
    est, _ = steer_run("no-gap", tmp_path / "no-gap")
    q = est[est.direction == "pressure"].set_index(["strength", "quantity"])
    for s in SETTINGS.strengths:
        e, twin = q.loc[(s, "E")], q.loc[(s, "twin_move")]
        excludes = e.low > 0 or e.high < 0
        assert not excludes or abs(twin.value) >= abs(e.value), (s, e.to_dict(), twin.value)
