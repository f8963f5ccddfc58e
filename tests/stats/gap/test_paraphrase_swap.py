"""Table 14's paraphrase swap on a planted table: the original and swapped gaps each on their own screened
set, the swapped - original difference paired on the scenarios screened in both."""

import numpy as np
import pandas as pd
import pytest

from contract.tables import SCENARIOS
from stats.gap import SyntheticSpec, analyze, simulate_tables
from stats.gap.tables import load_run

SHIFT = 0.2


def _with_paraphrases(tmp_path):
    table, manifest = simulate_tables(SyntheticSpec(n_scenarios=400, seed=8, readouts=("D", "J")))
    f4 = table[(table.family == "F4") & table.cell.isin(["primary", "twin"])].copy()
    f4["cell"] = f4["cell"].map({"primary": "paraphrase", "twin": "paraphrase_twin"})
    d = (f4.cell == "paraphrase") & (f4.readout == "D")
    f4.loc[d, "majority_violating_prob"] = f4.loc[d, "majority_violating_prob"].clip(upper=1 - SHIFT) + SHIFT
    # The paraphrase loses its stable judgment where the original acts most violating: its own screen
    # differs from the original's, and not at random.
    mp = f4[(f4.cell == "paraphrase") & (f4.readout == "D")].set_index("scenario_id")["majority_violating_prob"]
    unstable = set(mp[mp > mp.median()].index)
    j1 = (f4.cell == "paraphrase") & (f4.frame == "judge_1") & f4.scenario_id.isin(unstable)
    f4.loc[j1, "stability"] = False
    out = tmp_path / "run"
    out.mkdir()
    full = pd.concat([table, f4], ignore_index=True).astype({c: table[c].dtype for c in table.columns})
    full.to_parquet(out / SCENARIOS.file, index=False)
    import json
    (out / "manifest.json").write_text(json.dumps(manifest, default=str))
    return out


def test_swap_cell_on_its_own_sets(tmp_path):
    run_dir = _with_paraphrases(tmp_path)
    a = analyze(run_dir, n_boot=400)
    run = load_run(run_dir)
    from stats.gap.screen import screen
    orig, para = screen(run, a.floor), screen(run, a.floor, cell="paraphrase")
    gen = run.meta["generator"].to_numpy()
    mp_o = run.col("primary", "D", "majority_violating_prob")
    mp_p = run.col("paraphrase", "D", "majority_violating_prob")
    has = ~np.isnan(mp_p)
    rows = a.select("paraphrase_swap")
    assert rows
    for g in sorted(set(gen[has])):
        sub = f"origin={g}"
        o_set, p_set = orig.screened & has & (gen == g), para.screened & has & (gen == g)
        og, sg, diff = (a.get("paraphrase_swap", q, sub) for q in
                        ("original_gap", "swapped_gap", "swapped_minus_original"))
        assert (og.n, sg.n, diff.n) == (o_set.sum(), p_set.sum(), (o_set & p_set).sum())
        assert og.value == pytest.approx(mp_o[o_set].mean())
        assert diff.value == pytest.approx((mp_p - mp_o)[o_set & p_set].mean())
    # The paired difference is not the difference of the two unpaired gaps (their sets differ).
    diffs = [(a.get("paraphrase_swap", "swapped_minus_original", e.subset).value,
              a.get("paraphrase_swap", "swapped_gap", e.subset).value
              - a.get("paraphrase_swap", "original_gap", e.subset).value)
             for e in rows if e.quantity == "original_gap"]
    assert any(abs(p - u) > 0.02 for p, u in diffs)
