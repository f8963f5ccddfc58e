"""True values on unseen records: batched reads equal one-prompt reads, E pairs each scenario's own primary and
twin, and a training run's checkpoint reads as the adapter it holds."""

import copy
import dataclasses

import pytest
import torch

from engine.loading import load_model
from organisms import generalization as G
from organisms import resumable
from organisms.reference import scenario_values
from panels.schema import load_panel
from panels.split import records_of
from tests.organisms.test_training import _perturbed, tiny_recipe


def test_batched_reads_equal_one_prompt_reads():
    lm = load_model("tiny-qwen2", device="cpu")
    org = tiny_recipe("gap-general")
    records = records_of(load_panel(org.panel), "validation")[:2]
    model = _perturbed(lm, org).merge_and_unload()
    one = G.reads_on(model, org, lm, records, ("D", "J"), first=True)
    many = G.reads_on(model, org, lm, records, ("D", "J"), first=True, batch=3)
    assert {r.example.key for r in one} == {r.example.key for r in many}
    assert {r.example.readout for r in one} == {"D", "J"} and {r.example.cell for r in one} == {"primary", "twin"}
    by = {r.example.key: r for r in many}
    for r in one:
        assert r.mass == pytest.approx(by[r.example.key].mass, abs=1e-6)
        assert r.tempered == pytest.approx(by[r.example.key].tempered, abs=1e-6) and r.tempered != r.mass
    figures = G.summary(scenario_values(one), records)
    assert set(figures) >= {"E_J", "p_D/primary", "p_J/twin"} and "E_J0" not in figures


def test_excess_pairs_each_scenario_with_its_own_twin():
    records = records_of(load_panel("gap-v2", review=False), "validation")[:3]
    values = {}
    for k, r in enumerate(records):
        for cell, d, j in (("primary", 0.5 + 0.1 * k, 0.2), ("twin", 0.3, 0.25 - 0.05 * k)):
            values[(r.id, cell, "D")], values[(r.id, cell, "J")] = d, j
    per = G.excess(values, records)
    assert [round(v["E"], 10) for v in per.values()] == [0.25, 0.3, 0.35]
    mean, low, high = G.summary(values, records)["E_J"]
    assert mean == pytest.approx(0.3) and 0.25 - 1e-9 <= low <= mean <= high <= 0.35 + 1e-9


def test_a_checkpoint_reads_as_the_adapter_it_holds(tmp_path):
    base = load_model("tiny-qwen2", device="cpu")
    org = tiny_recipe(units=1, steps=2, batch=2, lr=3e-2, stream=True)
    lm = dataclasses.replace(base, model=copy.deepcopy(base.model))
    exs = [e for e in resumable.examples(org, lm) if e.readout == "D"][:2]
    fitted = resumable.fit_resumable(lm, org, tmp_path / "ckpt", exs=exs, every=1)
    again = dataclasses.replace(base, model=copy.deepcopy(base.model))
    model, step = resumable.checkpoint_model(again, org, tmp_path / "ckpt" / resumable.CHECKPOINT)
    ids = torch.tensor([exs[0].ids])
    with torch.no_grad():
        assert step == 2
        assert torch.allclose(model(input_ids=ids).logits, fitted.model(input_ids=ids).logits, atol=1e-5)


def test_figures_from_a_stored_reference_are_the_hand_computed_ones(tmp_path):
    """`--reference`: the reads of a reference.json averaged per scenario, cell and readout (over orders), then E."""
    import json

    records = records_of(load_panel("gap-v2", review=False), "held-out")[:2]
    reads, hand = {}, []
    for k, r in enumerate(records):
        shares = {("primary", "D"): (0.6 + 0.1 * k, 0.8), ("twin", "D"): (0.2, 0.4), ("primary", "J"): (0.1, 0.3),
                  ("twin", "J"): (0.2, 0.2)}
        for (cell, readout), pair in shares.items():
            for o, share in enumerate(pair):
                reads[f"{r.id}|{cell}|{readout}|frame|o{o}"] = [share, share, 1.0]
        m = {key: sum(pair) / 2 for key, pair in shares.items()}
        hand.append(m[("primary", "D")] - m[("primary", "J")] - m[("twin", "D")] + m[("twin", "J")])
    (tmp_path / "reference.json").write_text(json.dumps({"temperature": 0.7, "reads": reads}))
    figures = G.summary(G.reference_values(tmp_path), records)
    assert figures["E_J"][0] == pytest.approx(sum(hand) / 2) and hand == pytest.approx([0.4, 0.45])
