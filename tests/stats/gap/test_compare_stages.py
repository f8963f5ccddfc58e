"""`compare` along a lineage of any number of stages: ordered by the step a stage's name carries (step-100,
rl-200, step_1000) or by a given order, planted excesses recovered in that order; more than ALL_PAIRS_UP_TO
stages report neighbour steps and last minus first; an order that leaves a stage of its lineage out is refused."""

import pytest

from contract.names import STAGES, stage_step
from stats.core.errors import CompareError
from stats.gap import GATE_FAMILIES, SyntheticSpec, analyze, compare, compare_runs, make_run_dir
from stats.gap.compare import ALL_PAIRS_UP_TO, find_estimate, stage_key

N_BOOT = 100
FLOOR = 0.5


def _runs(tmp_path, planted: dict, lineage="lin"):
    """One synthetic chat run per stage (shared seed: planted differences come back exactly)."""
    out = []
    for stage, effect in planted.items():
        spec = SyntheticSpec(model=f"{lineage}-{stage}", n_scenarios=120, effect=effect, seed=3, readouts=("D", "J"),
                             lineage=lineage, stage=stage)
        out.append(analyze(make_run_dir(tmp_path / spec.model, spec), n_boot=N_BOOT, floor=FLOOR))
    return out


def test_stage_names_and_their_order():
    assert STAGES == ("base", "sft", "dpo", "final")
    assert [stage_step(s) for s in ("rl-200", "step-1000", "step_1000", "ckpt3", "sft", "late")] == [200, 1000, 1000, 3, None, None]
    assert (stage_key("base") < stage_key("sft") < stage_key("dpo") < stage_key("rl-10") < stage_key("step-150")
            < stage_key("rl-200") < stage_key("step_1000") < stage_key("final"))
    assert stage_key("late", ("early", "late")) > stage_key("early", ("early", "late")) > stage_key("base")
    with pytest.raises(CompareError, match="stage 'late' .* carries no step"):
        stage_key("late")


def test_many_steps_sorted_by_step_with_neighbour_steps(tmp_path):
    planted = {"step-500": 0.09, "step-100": 0.01, "step_300": 0.05, "step-200": 0.03, "step-400": 0.07}
    c = compare(_runs(tmp_path, planted), seed=0, n_boot=N_BOOT, floor=FLOOR, gate=GATE_FAMILIES)
    (sw,) = c.sweeps
    assert sw.stages == ("step-100", "step-200", "step_300", "step-400", "step-500") and len(sw.stages) > ALL_PAIRS_UP_TO
    steps = [e.quantity for e in sw.estimates if " - " in e.quantity and e.subset == "unscreened"]
    assert steps == ["step-200 - step-100", "step_300 - step-200", "step-400 - step_300", "step-500 - step-400",
                     "step-500 - step-100"]
    for earlier, later in zip(sw.stages, sw.stages[1:]):
        step = find_estimate(sw.estimates, f"{later} - {earlier}", "final screen")
        assert step.value == pytest.approx(planted[later] - planted[earlier], abs=0.005)
    assert [r["stage"] for r in sw.rows] == list(sw.stages)  # the figure's points, in step order
    assert sw.final.model == "lin-step-500"  # no "final" stage: the last checkpoint stands for it (panel b)


@pytest.mark.heavy  # the bootstrap over several planted runs
def test_a_given_order(tmp_path):
    planted = {"late": 0.06, "warmup": 0.0, "mid": 0.03}
    runs = _runs(tmp_path, planted)
    with pytest.raises(CompareError, match="stage 'late'"):
        compare(runs, seed=0, n_boot=N_BOOT, floor=FLOOR, gate=GATE_FAMILIES)
    with pytest.raises(CompareError, match="--order: lineage lin: step-9 not listed while mid, warmup are"):
        compare(runs, seed=0, n_boot=N_BOOT, floor=FLOOR, gate=GATE_FAMILIES, roles={"lin-late": "lin:step-9"},
                order=("warmup", "mid"))
    c = compare(runs, seed=0, n_boot=N_BOOT, floor=FLOOR, gate=GATE_FAMILIES, order=("warmup", "mid", "late"))
    (sw,) = c.sweeps
    assert sw.stages == ("warmup", "mid", "late")
    assert find_estimate(sw.estimates, "late - warmup", "final screen").value == pytest.approx(0.06, abs=0.005)
    assert [r.stage for r in c.recipe] == ["warmup", "mid", "late"]
    lines = compare_runs([a.run.path for a in runs], tmp_path / "cmp", n_boot=N_BOOT, order=("warmup", "mid", "late"))
    assert any(line.startswith("sweep lin: E warmup") for line in lines)
    assert (tmp_path / "cmp" / "checkpoint_sweep_lin.png").is_file()


@pytest.mark.heavy  # the bootstrap over several planted runs
def test_a_floor_that_removes_most_scenarios_is_named_per_run(tmp_path):
    """A run whose letter mass the floor mostly removes gets stats' warning line in compare's headline and report,
    naming the run, the floor and the median letter mass and suggesting --mass-floor; a lower floor removes it."""
    from stats.gap import run_report
    from stats.gap.report import floor_warnings

    dirs = [make_run_dir(tmp_path / s, SyntheticSpec(model=f"lin-{s}", n_scenarios=60, seed=3, readouts=("D", "J"),
                                                      lineage="lin", stage=s, below_floor=b))
            for s, b in (("step-1", 1.0), ("step-2", 0.03))]
    lines = compare_runs(dirs, tmp_path / "c", n_boot=20)
    assert lines[0].endswith("; mass floor 0.5")
    (warning,) = [x for x in lines if x.startswith("warning:")]
    assert warning.startswith("warning: lin-step-1 (lin:step-1): the mass floor 0.5 removes 46 of 46 gate-family "
                              "primaries (median letter mass: D 0.2")
    assert "--mass-floor" in warning and f"- {warning}" in (tmp_path / "c" / "compare_report.md").read_text()
    # the very line `readout stats` prints for that run (one function), without the run's name
    assert warning.replace("lin-step-1 (lin:step-1): ", "") in run_report(dirs[0], tmp_path / "s", n_boot=20)
    lines = compare_runs(dirs, tmp_path / "c", n_boot=20, mass_floor=0.01)
    assert lines[0].endswith("; mass floor 0.01") and not any(x.startswith("warning:") for x in lines)
    assert "mass floor 0.01" in (tmp_path / "c" / "compare_report.md").read_text()
    # a raw-frame run (a base model: no screen) is warned about on its raw readouts
    base = make_run_dir(tmp_path / "b", SyntheticSpec(model="b", n_scenarios=60, seed=3, readouts=("raw",),
                                                      lineage="lin", stage="base", raw_below_floor=0.9))
    (raw_warning,) = floor_warnings(analyze(base, n_boot=20), "b (lin:base)")
    assert raw_warning.startswith("warning: b (lin:base): the mass floor 0.5 removes 51 of 60 raw-frame primaries "
                                  "(median letter mass: raw_D 0.2")
