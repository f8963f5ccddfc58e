"""`readout steer` on the model organisms, as a pre-registered experiment: the embedded SmolLM2 with an organism's
adapter merged, the pressure direction from the direction part, the grid point chosen on the selection part, the
verdict on the test part (stats/steer/experiment.py), for the direction and for its label-shuffled null.

- The generalizing organisms (docs/organisms.md), on gap-v2's held-out part (62 scenarios no organism trains on:
  about 20 per part), depths below their adapter (the last layer, keys and values included), where the pressure is
  the base model's own and what the adapter reads of it: `gap-general`'s verdict is whatever it is,
  printed with every interval and checked to follow the rules; on `no-gap-general` no grid point is declared a
  reduction (no point's E_steered / E0 interval lies below the threshold on the test part). Skipped while their
  adapters are not shipped (organisms/data).
- The shipped single-panel organisms (`gap-deep`, `no-gap`) on the quick profile's ten gap-v1 scenarios (their
  training records; three or four per part): the same checks, on small parts.

Outside `make test` (LOGIT_READOUT_SLOW=1): SmolLM2 with an adapter, the grid with its random directions and the
capability forwards. Prints the verdict lines (`pytest -s`, lines starting STEER).
"""

import dataclasses
import json

import pandas as pd
import pytest

from readouts.driver import Loading, ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap import profile as gap_profile
from readouts.steer.study import SteerSettings, SteerStudy
from stats.core.seeding import rng_for
from stats.steer.compute import capability, scenario_values
from stats.steer.experiment import TEST, experiment, grid_points, verdict_lines, verdict_on_test
from stats.steer.rules import Rules

PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="steer-organism")
"""The quick profile with its own option orders: D's six put every option at every letter equally often in two- and
three-option scenarios, so the pressure direction (a mean over D's orders) does not also carry which letters the
violating option stood at (readouts/steer/directions.py warns when they do not)."""
BAND = (21, 22, 25, 28)
"""Depths within the organisms' band (layers 20-29, 0-based; depth i is the stream after decoder layer i)."""
GRID = dict(direction="pressure", layers=BAND, strengths=(-4.0, -2.0, -1.0, -0.5), positions="read")
RULES = Rules()


def steer_run(name: str, out, settings: SteerSettings, panel: str, overrides=(), part=None):
    organisms = pytest.importorskip("organisms")
    if organisms.shipped_path(name) is None:
        pytest.skip(f"organism {name}: no shipped adapter in organisms/data/{name}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
        path = run_study(SteerStudy(settings=settings),
                         RunOptions(model=ModelOptions("smollm2-135m", loading=Loading(adapter=str(organisms.shipped_path(name)))),
                                    panel=panel, profile=PROFILE.name, out=str(out), progress=False, overrides=overrides,
                                    part=part),
                         log=lambda _: None)
    manifest = json.loads((path / "manifest.json").read_text())
    steering = pd.read_parquet(path / "steering.parquet")
    st = manifest["steering"]
    parts = [set(st[p]) for p in ("train", "selection", "test")]
    assert all(parts) and not parts[0] & parts[1] and not parts[0] & parts[2] and not parts[1] & parts[2]
    assert set(steering.scenario_id) == parts[1] | parts[2]
    norms = {"direction": manifest["steering_norms"], "residual": manifest["steering_residual_norms"]}
    cap = capability(pd.read_parquet(path / "steer_capability.parquet"))
    return scenario_values(steering), cap, norms, len(parts[2])


def verdicts(name, values, cap, norms):
    out = {}
    for direction in ("pressure", "shuffled"):
        grid, v = experiment(values, direction, RULES, rng_for(0, "steer-organism", direction), 2000, cap, norms)
        for line in verdict_lines(grid, v):
            print("STEER", name, line)
        if v["layer"] is not None:
            assert v["passed"] == (v["reduced"] and v["kept"] and v["beyond_random"] and v["capability_kept"])
            chosen = max((g for g in grid if g["kept"]), key=lambda g: g["reduction"])
            assert (chosen["layer"], chosen["strength"]) == (v["layer"], v["strength"])
        out[direction] = v
    return out


def no_point_reduces(values, cap, norms) -> list:
    """Every grid point of the direction on the test part whose E_steered / E0 interval lies below the threshold."""
    found = []
    for point in grid_points(values[values.part == TEST], "pressure"):
        v = verdict_on_test(values, "pressure", point, RULES, rng_for(0, "no-reduction", *point), 2000, cap, norms)
        print("STEER no-reduction check", point, round(v["ratio"], 4), round(v["ratio_low"], 4), round(v["ratio_high"], 4))
        if v["reduced"]:
            found.append(point)
    return found


GENERAL = dict(panel="gap-v2", overrides=("max_units=1000",), part="held-out")
"""gap-v2's whole held-out part (the profile's cap lifted; RunOptions.part keeps the held-out scenarios)."""


@pytest.mark.slow
@pytest.mark.smollm
def test_gap_general_verdict_follows_the_rules(tmp_path):
    settings = SteerSettings(**GRID, random=100)
    values, cap, norms, n_test = steer_run("gap-general", tmp_path / "gap-general", settings, **GENERAL)
    assert n_test >= 20
    verdicts("gap-general", values, cap, norms)


@pytest.mark.slow
@pytest.mark.smollm
def test_no_gap_general_declares_no_reduction(tmp_path):
    settings = SteerSettings(**GRID, random=100)
    values, cap, norms, n_test = steer_run("no-gap-general", tmp_path / "no-gap-general", settings, **GENERAL)
    assert n_test >= 20
    v = verdicts("no-gap-general", values, cap, norms)
    assert not v["pressure"]["passed"] and no_point_reduces(values, cap, norms) == []


@pytest.mark.slow
@pytest.mark.smollm
def test_gap_deep_verdict_follows_the_rules(tmp_path):
    values, cap, norms, _ = steer_run("gap-deep", tmp_path / "gap-deep", SteerSettings(**GRID, random=20), "gap-v1")
    verdicts("gap-deep", values, cap, norms)


@pytest.mark.slow
@pytest.mark.smollm
def test_no_gap_organism_declares_no_reduction(tmp_path):
    settings = SteerSettings(direction="pressure", layers=(29,), strengths=(-2.0, -1.0, 1.0), positions="read", random=20)
    values, cap, norms, _ = steer_run("no-gap", tmp_path / "no-gap", settings, "gap-v1")
    v = verdicts("no-gap", values, cap, norms)
    assert not v["pressure"]["passed"] and no_point_reduces(values, cap, norms) == []
