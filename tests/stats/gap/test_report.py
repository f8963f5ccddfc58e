"""`stats.gap.run_report` and `stats.gap.compare_runs` end to end on synthetic run directories,
runs with missing readouts, and the layering rule that `stats` never imports torch."""

import subprocess
import sys

import pandas as pd
import pytest

from stats.core.errors import CompareError
from stats.core.output import num
from stats.gap import Role, SyntheticSpec, analyze, compare_runs, make_run_dir, role_of, run_report
from stats.gap.compare import stage_key
from tests.helpers import ROOT

N_BOOT = 300
FULL_TABLES = {"estimates.csv", "screen.csv", "floors.csv", "ladder.csv", "slices.csv", "dose.csv",
               "per_scenario.csv", "skipped.csv", "report.md", "floor_sensitivity.csv"}
FULL_FIGURES = {"calibration_ladder.png", "scatter_pj_pd.png", "strictness_ladder.png", "slices.png",
                "f4_by_generator.png", "control_vs_excess.png", "dose_arm.png"}


def test_import_stats_does_not_import_torch():
    code = ("import sys, stats, stats.core, stats.gap, stats.gap.figures, stats.nsi, stats.nsi.figures; "
            "bad = [m for m in ('torch', 'transformers', 'engine', 'readouts', 'panels', 'matplotlib.pyplot') "
            "if m in sys.modules]; "
            "print(','.join(bad)); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"stats pulled in {res.stdout.strip()} {res.stderr[-500:]}"


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("runs") / "full", SyntheticSpec(n_scenarios=200, seed=3))


def test_report_writes_every_table_and_figure(full_run):
    lines = run_report(full_run, seed=0, n_boot=N_BOOT)
    out = full_run / "stats"
    names = {p.name for p in out.iterdir()}
    assert FULL_TABLES | FULL_FIGURES <= names
    text = "\n".join(lines)
    for key in ("paired excess E (screened, L0)", "verdict level (continuous)", "binary excess",
                "known-gap control", "selection-matched null", "dose arm", "raw frame", "bridge"):
        assert key in text
    assert not any(line.startswith("skipped") for line in lines)
    ladder = pd.read_csv(out / "ladder.csv")
    assert list(ladder["level"]) == ["L0", "L1", "L2"]
    assert {"E", "E_low", "E_high", "E_n", "E_mde", "binary_excess_low"} <= set(ladder.columns)
    est = pd.read_csv(out / "estimates.csv")
    with_value = est[est["value"].notna()]
    with_ci = with_value[with_value["n"] >= 2]
    assert (with_value["n"] > 0).all() and with_ci["low"].notna().all() and with_ci["high"].notna().all()
    # A slice with one scenario (family x generator cuts are small) has a value and says why it has no CI.
    assert (with_value.loc[with_value["n"] < 2, "note"] == "n < 2: no CI").all()
    # The headline's binary excess carries the nested CI (the paper's) and the scenario-only one beside it.
    b0 = est[(est["quantity"] == "binary_excess_scenario_only") & (est["subset"] == "L0")].iloc[0]
    assert f"scenario-only CI [{num(b0['low'])}, {num(b0['high'])}]" in text
    report = (out / "report.md").read_text()
    assert "## Strictness ladder (Table 5, Figure 3)" in report and "## Screen outcomes (Table 13)" in report
    for png in FULL_FIGURES:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_analysis_is_seeded(full_run):
    a, b, c = (analyze(full_run, seed=seed, n_boot=N_BOOT) for seed in (4, 4, 5))
    assert a.estimates == b.estimates
    assert [e.low for e in a.estimates] != [e.low for e in c.estimates]
    assert [e.value for e in a.estimates] == [e.value for e in c.estimates]


@pytest.mark.parametrize("readouts, skipped, figures_absent", [
    (("D", "J"), ["known-gap control", "raw frame", "dose arm"], {"dose_arm.png"}),
    (("raw",), ["continuous readout", "known-gap control"], FULL_FIGURES),
    (("D", "J0", "control"), ["continuous readout"], FULL_FIGURES - {"calibration_ladder.png", "control_vs_excess.png"}),
])
def test_report_with_missing_readouts(tmp_path, readouts, skipped, figures_absent):
    run = make_run_dir(tmp_path / "r", SyntheticSpec(n_scenarios=120, readouts=readouts, seed=1))
    lines = run_report(run, n_boot=N_BOOT)
    skipped_lines = [line for line in lines if line.startswith("skipped")]
    for s in skipped:
        assert any(s in line for line in skipped_lines), (s, lines)
    names = {p.name for p in (run / "stats").iterdir()}
    assert {"estimates.csv", "report.md", "skipped.csv"} <= names
    assert not (figures_absent & names)
    report = (run / "stats" / "report.md").read_text()
    assert "## Skipped analyses" in report
    assert len(pd.read_csv(run / "stats" / "skipped.csv")) == len(skipped_lines)


def test_role_of_reads_the_manifest_and_overrides(tmp_path):
    tulu = {"model": {"name": "tulu-3-8b-dpo", "lineage": "tulu-3-8b", "stage": "dpo", "base_lineage": "llama-3.1-8b"}}
    assert role_of(tulu, "tulu-3-8b-dpo", tmp_path, None) == Role("tulu-3-8b", "dpo", "llama-3.1-8b")
    # Names alone say nothing: a "-sft" suffix without registry data is not a stage.
    assert role_of({"model": {"name": "x-sft"}}, "x-sft", tmp_path, None) == Role("x-sft", "final")
    assert role_of({}, "my-ckpt", tmp_path, {"my-ckpt": "mine:rl-200"}).stage == "rl-200"
    assert stage_key("sft") < stage_key("dpo") < stage_key("rl-10") < stage_key("rl-200") < stage_key("final")
    with pytest.raises(CompareError, match="stage 'rl'"):
        role_of({}, "x", tmp_path, {"x": "mine:rl"})
    with pytest.raises(CompareError):
        compare_runs([], tmp_path / "out")


@pytest.mark.heavy  # the bootstrap over several planted runs
def test_compare_end_to_end(tmp_path):
    root = tmp_path / "runs"
    olmo = dict(lineage="olmo-3-7b")
    specs = [SyntheticSpec(model="olmo-3-7b-sft", n_scenarios=150, effect=0.02, seed=1, stage="sft", **olmo),
             SyntheticSpec(model="olmo-3-7b-dpo", n_scenarios=150, effect=0.03, seed=2, stage="dpo", **olmo),
             SyntheticSpec(model="olmo-3-7b", n_scenarios=150, effect=0.06, seed=3, stage="final", **olmo),
             SyntheticSpec(model="llama-3.1-8b", n_scenarios=150, effect=0.05, seed=4, readouts=("D", "J", "J0", "control"),
                           lineage="llama-3.1-8b", stage="final"),
             SyntheticSpec(model="olmo-3-7b-base", n_scenarios=150, readouts=("raw",), seed=5, stage="base", **olmo)]
    dirs = [make_run_dir(root / s.model, s) for s in specs]
    out = tmp_path / "cmp"
    lines = compare_runs(dirs, out, seed=0, n_boot=N_BOOT)
    names = {p.name for p in out.iterdir()}
    assert {"cross_recipe.csv", "compare_estimates.csv", "compare_report.md", "control_vs_excess.png",
            "checkpoint_sweep_olmo-3-7b.png", "three_cell_olmo-3-7b.png", "bridge.png"} <= names
    recipe = pd.read_csv(out / "cross_recipe.csv")
    assert list(recipe["model"]) == ["llama-3.1-8b", "olmo-3-7b-sft", "olmo-3-7b-dpo", "olmo-3-7b"]
    olmo = recipe.set_index("model").loc["olmo-3-7b"]
    assert olmo["base_raw_E_n"] > 0 and olmo["E_own_screen_n"] > 0 and olmo["control_passes"]
    est = pd.read_csv(out / "compare_estimates.csv")
    steps = est[est["analysis"].str.startswith("sweep") & est["quantity"].isin(["dpo - sft", "final - dpo"])]
    assert len(steps) == 4 and steps["mde"].notna().all()
    assert (est["quantity"] == "Delta_E (base - instruct)").any()
    text = "\n".join(lines)
    assert "sweep olmo-3-7b" in text and "three-cell olmo-3-7b-base vs olmo-3-7b" in text
    assert "bridge llama-3.1-8b" not in text  # llama has no raw readouts here


def test_compare_single_chat_run_skips_cross_run_analyses(tmp_path):
    d = make_run_dir(tmp_path / "one", SyntheticSpec(model="qwen2.5-7b", n_scenarios=100, readouts=("D", "J"), seed=2))
    lines = compare_runs([d], tmp_path / "cmp", n_boot=N_BOOT)
    skipped = [line for line in lines if line.startswith("skipped")]
    assert any("checkpoint sweep" in s for s in skipped) and any("three-cell" in s for s in skipped)
    assert (tmp_path / "cmp" / "cross_recipe.csv").exists()
