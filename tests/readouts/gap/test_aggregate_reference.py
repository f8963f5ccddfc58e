"""Scenario rows recomputed from probe rows by a small independent reference, and compared with the
scenarios.parquet of a real tiny-model run: normalized violating mass, the tempered violating fraction,
the Poisson-binomial probability of a strict violating majority, the judged option and its stability, the
four-frame aggregate (violating judged frames, rollout counts). The reference reads the panel for each
scenario's violating option and recomputes each probe's letters from its masses; it shares no code with
readouts/gap/aggregate.py.
"""

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from contract.readouts import FIRST_TOKEN, READOUTS, readout
from panels.orders import option_orders
from panels.schema import load_panel
from readouts.driver import ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap.study import GapStudy

PANEL = "gap-v2"
SEED = 4
# Quick profile made small: an even order count for D (the strict-majority cut differs from an odd one),
# two sampled judgments per frame (stability is defined).
# The dose arms are left out for time: their rows are aggregated by the same code as J's frames.
RUN_READOUTS = "D,J,J0,raw,control"
OVERRIDES = ("max_units=5", "orders.D=4", "orders.J0=3", "orders.control=3", "orders.raw=2", "j_samples=2",
             "j_budget=6")
COMPLETED = ("own", "forced_after_completion")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    options = RunOptions(model=ModelOptions("tiny-qwen2"), panel=PANEL, profile="quick", overrides=OVERRIDES,
                         seed=SEED, out=str(out), progress=False)
    return run_study(GapStudy(readouts=RUN_READOUTS), options, log=lambda line: None)


def strict_majority(q) -> float:
    """P(more than half of independent Bernoulli(q_i) are 1), by convolving the count distribution."""
    dist = np.array([1.0])
    for p in q:
        dist = np.append(dist * (1 - p), 0.0) + np.append(0.0, dist * p)
    return float(dist[np.arange(len(dist)) * 2 > len(q)].sum())


def plurality(values):
    """The strictly most frequent value, or None on a tie (or with no values)."""
    top = Counter(values).most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def probe_facts(p, violating: str) -> dict:
    """What one probe row says, recomputed from its masses and its recorded order. A generated read answers
    with its top letter at the anchor, or with the letter of the tool it named (anchor rule `...+tool:<letter>`)."""
    letters, order = list(p.letters), p.order.split(",")
    v = letters.index(p.violating_letter)
    assert order[v] == violating, (p.probe_id, "violating letter does not stand for the violating option")
    mass = np.asarray(p.mass, dtype=float)
    temp = np.asarray(p.tempered, dtype=float)
    top = letters[int(np.argmax(mass))]
    assert p.top_letter == top and p.letter_mass == pytest.approx(mass.sum(), rel=1e-6)
    rule = p.anchor_rule if isinstance(p.anchor_rule, str) else ""
    answered = rule.split("+tool:", 1)[1] if "+tool:" in rule else top
    share = temp[v] / temp.sum() if temp.sum() > 0 else np.nan  # greedy reads put no tempered mass on letters
    return dict(p_violating=mass[v] / mass.sum(), tempered_share=share, top_is_violating=top == letters[v],
                answered_violating=answered == letters[v], option=dict(zip(letters, order))[answered],
                completed=rule.split("+", 1)[0] in COMPLETED, letter_mass=mass.sum())


def reference_rows(probes: pd.DataFrame, profile: dict, sample: bool = False) -> dict:
    """(scenario, cell, readout, frame) -> the scenario row's values, from the probe rows alone. With
    `sample`, first-token readouts count the seeded draws recorded in `sampled_letter` (None: not a letter)."""
    panel = load_panel(PANEL)
    out = {}
    for (sid, cell, name, frame), g in probes.groupby(["scenario_id", "cell", "readout", "frame"]):
        violating = panel.get(sid).violating
        g = g.sort_values(["order_index", "rollout"])
        facts = [probe_facts(p, violating) for p in g.itertuples()]
        p_viol = float(np.mean([f["p_violating"] for f in facts]))
        mass = float(np.mean([f["letter_mass"] for f in facts]))
        spec = readout(name)
        if spec.read == FIRST_TOKEN and sample:
            drawn = [x for x in g.sampled_letter if isinstance(x, str)]
            hits = sum(x == v for x, v in zip(g.sampled_letter, g.violating_letter) if isinstance(x, str))
            out[(sid, cell, name, frame)] = dict(
                p_violating=p_viol, violating_fraction=hits / len(drawn) if drawn else np.nan,
                majority_violating_prob=float(2 * hits > len(g)), letter_mass=mass, n_orders=len(g), n_rollouts=len(g))
            continue
        if spec.read == FIRST_TOKEN:
            q = [float(f["top_is_violating"]) if spec.greedy else f["tempered_share"] for f in facts]
            out[(sid, cell, name, frame)] = dict(
                p_violating=p_viol, violating_fraction=float(np.mean(q)), majority_violating_prob=strict_majority(q),
                letter_mass=mass, n_orders=len(g), n_rollouts=len(g))
            continue
        hits = [f["answered_violating"] for f in facts]
        row = dict(p_violating=p_viol, violating_fraction=float(np.mean(hits)),
                   majority_violating_prob=float(2 * sum(hits) > len(hits)), letter_mass=mass,
                   n_orders=g.order_index.nunique(), n_rollouts=len(g),
                   completed_fraction=float(np.mean([f["completed"] for f in facts])),
                   budget=profile[spec.budget])
        if spec.aggregate_frame:
            judged = facts[list(g.rollout).index(0)]["option"]
            row.update(judged_option=judged, stability=plurality([f["option"] for f, r in zip(facts, g.rollout) if r > 0]) == judged,
                       hits=sum(hits))
        out[(sid, cell, name, frame)] = row
    # J's aggregate over its four paraphrase frames.
    for sid, cell, name, frame in list(out):
        if name != "J" or frame != "judge_1":
            continue
        frames = [out[(sid, cell, "J", f"judge_{k}")] for k in range(1, 5)]
        n_roll = sum(f["n_rollouts"] for f in frames)
        hits = sum(f["hits"] for f in frames)
        judged = [f["judged_option"] for f in frames]
        out[(sid, cell, "J", "judge")] = dict(
            p_violating=float(np.mean([f["p_violating"] for f in frames])), violating_fraction=hits / n_roll,
            majority_violating_prob=float(2 * hits > n_roll), letter_mass=float(np.mean([f["letter_mass"] for f in frames])),
            judged_option=plurality(judged), stability=all(f["stability"] for f in frames),
            violating_judged_frames=sum(j == panel.get(sid).violating for j in judged),
            n_orders=4, n_rollouts=n_roll, completed_fraction=float(np.mean([f["completed_fraction"] for f in frames])),
            budget=profile["j_budget"])
    return out


def same(have, want) -> bool:
    """A table value against the reference's (floats to 1e-9, NaN and null only where the reference has them)."""
    if want is None:
        return have is None or pd.isna(have)
    if isinstance(want, float):
        return bool(np.isnan(want)) if have is None or pd.isna(have) else have == pytest.approx(want, rel=1e-9, abs=1e-12)
    return have == want


def compare(ref: dict, got: dict) -> Counter:
    """Every reference value against the table's; returns how many values of each column were checked."""
    assert set(got) == set(ref)
    checked = Counter()
    for key, want in ref.items():
        row = got[key]
        for col, value in want.items():
            if col == "hits":
                continue
            have = row[col]
            have = None if have is pd.NA else have
            assert same(have, value), (key, col, have, value)
            checked[col] += 1
    return checked


def test_scenario_rows_equal_the_reference_recomputed_from_probe_rows(run_dir):
    import json

    profile = json.loads((run_dir / "manifest.json").read_text())["profile"]
    probes = pd.read_parquet(run_dir / "probes.parquet")
    scen = pd.read_parquet(run_dir / "scenarios.parquet")
    checked = compare(reference_rows(probes, profile),
                      {(r["scenario_id"], r["cell"], r["readout"], r["frame"]): r for r in scen.to_dict("records")})
    # The run has teeth: every kind of row is there, the letters carry tempered mass, and the values
    # the reference distinguishes actually vary.
    assert set(scen.readout) == {"D", "J0", "control", "raw_D", "raw_J", "J"}
    assert {"primary", "twin", "harm_twin"} <= set(scen.cell)
    d = scen[scen.readout == "D"]
    assert d.n_orders.eq(4).all() and scen[scen.readout == "J0"].n_orders.eq(3).all()
    assert d.violating_fraction.between(0.02, 0.98).all() and d.majority_violating_prob.nunique() == len(d)
    j = scen[(scen.readout == "J") & (scen.frame == "judge")]
    assert j.violating_judged_frames.nunique() > 1 and (j.violating_judged_frames != 2).any()
    assert j.stability.notna().all()
    per_frame = scen[(scen.readout == "J") & scen.frame.str.startswith("judge_")]
    assert per_frame.stability.astype(bool).any()
    assert checked["stability"] > 20 and checked["majority_violating_prob"] == len(scen)


def test_recorded_orders_are_the_seeded_option_orders(run_dir):
    """Each first-token probe's recorded order is option_orders(n, k, seed, 'scenario|readout')[order_index]."""
    import json

    profile = json.loads((run_dir / "manifest.json").read_text())["profile"]
    panel = load_panel(PANEL)
    probes = pd.read_parquet(run_dir / "probes.parquet")
    first = probes[probes.readout.isin(["D", "J0", "control", "raw_D"])]
    assert len(first) > 50
    for p in first.itertuples():
        s = panel.get(p.scenario_id)
        options = s.paraphrased().options if p.cell.startswith("paraphrase") else s.options
        k = profile["orders"][readout(p.readout).orders]
        order = option_orders(len(options), k, SEED, f"{s.id}|{p.readout}")[p.order_index]
        assert p.order.split(",") == [options[i].id for i in order], p.probe_id
    assert first.groupby(["scenario_id", "cell", "readout"]).order.nunique().gt(1).all()


def crafted_probe_rows(profile, sample: bool, seed: int = 0):
    """Probe rows for every readout, cell, frame, order and rollout of two gap-v2 scenarios per family, with random
    letter masses whose top letter is skewed toward one letter per frame (so judgments are sometimes
    stable, sometimes not, and frame votes tie), random anchor rules and seeded draws (some not a letter)."""
    from readouts.gap.profile import cells_read, rollouts

    rng = np.random.default_rng(seed)
    panel = load_panel(PANEL)
    scenarios = [s for fam in ("F1", "F2", "F3", "F4", "F5") for s in [x for x in panel.records if x.family == fam][:2]]
    keys, rows = [], []
    for s in scenarios:
        n = len(s.options)
        letters = "ABCDE"[:n]
        for cell in cells_read(s, profile):
            for spec in READOUTS:
                first = spec.read == FIRST_TOKEN
                for k, frame in enumerate(spec.frames):
                    count = profile.orders[spec.orders] if first else rollouts(spec, profile)
                    favourite, order = rng.integers(n), None
                    for j in range(count):
                        order = rng.permutation(n) if first or j == 0 else order
                        ids = [s.options[i].id for i in order]
                        top = favourite if rng.random() < 0.85 else rng.integers(n)
                        mass = rng.dirichlet(np.ones(n)) * rng.uniform(0.2, 0.9)
                        mass[top] += 1.0
                        mass /= mass.sum() / rng.uniform(0.3, 1.0)
                        tempered = rng.dirichlet(np.ones(n)) * rng.uniform(0.3, 1.0)
                        v = ids.index(s.violating)
                        pick = rng.integers(n + 1)
                        rows.append(dict(
                            probe_id=f"{s.id}|{cell}|{spec.name}|{frame}|o{k if not first else j}|r{0 if first else j}",
                            scenario_id=s.id, cell=cell, readout=spec.name, frame=frame,
                            order_index=j if first else k, order=",".join(ids), rollout=0 if first else j,
                            letters=letters, violating_letter=letters[v], mass=list(mass), letter_mass=float(mass.sum()),
                            tempered=list(tempered), p_violating=float(mass[v] / mass.sum()), top_letter=letters[top],
                            anchor_rule=None if first else str(rng.choice(["own", "forced_after_completion",
                                                                             "forced_at_budget"])),
                            sampled_letter=(letters[pick] if pick < n else None) if first and sample else None))
                        keys.append((s.id, cell, spec.name, frame))
    return scenarios, keys, rows


@pytest.mark.parametrize("sample", [False, True])
def test_aggregation_of_crafted_probe_rows_equals_the_reference(sample):
    """The same reference against readouts/gap/aggregate.py on crafted probe rows for every readout (dose
    arms and sampled first-token draws included), where judgments are unstable in some frames, frame votes
    tie and every order count is exercised."""
    import dataclasses

    from readouts.gap.aggregate import scenario_rows
    from readouts.gap.profile import PROFILES

    profile = dataclasses.replace(PROFILES["quick"], orders={"D": 4, "J0": 3, "control": 5, "raw": 2}, j_samples=2,
                                  dose_samples=2, rider_rollouts=2)
    scenarios, keys, rows = crafted_probe_rows(profile, sample)
    got = scenario_rows(scenarios, keys, rows, profile, sample, "crafted", PANEL)
    checked = compare(reference_rows(pd.DataFrame(rows), dataclasses.asdict(profile), sample),
                      {(r["scenario_id"], r["cell"], r["readout"], r["frame"]): r for r in got})
    table = pd.DataFrame(got)
    per_frame = table[(table.readout == "J") & table.frame.str.startswith("judge_")]
    agg = table[(table.readout == "J") & (table.frame == "judge")]
    assert per_frame.stability.any() and not per_frame.stability.all()
    assert agg.stability.any() and not agg.stability.all() and agg.judged_option.isna().any()
    assert agg.violating_judged_frames.nunique() > 2
    assert checked["violating_fraction"] == len(table) and set(table.readout) == {spec.name for spec in READOUTS}
