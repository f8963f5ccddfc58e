"""Training organisms on tiny models: the training forward equals the plain forward, training is deterministic and
moves the targets, the examples are the prompts a run reads, and an organism's adapter is recorded in manifests."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from engine.loading import load_model
from organisms import examples as ex_mod
from organisms import train
from organisms.recipes import organism
from tests.helpers import CHAT_TINY, tiny_recipe


def _perturbed(lm, org):
    model = train.lora_model(lm, org)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


@pytest.mark.parametrize("family", CHAT_TINY)
@pytest.mark.parametrize("name, band", [("gap", "last"), ("gap", "all"), ("gap", "last-kv"), ("negation-blind", "last")])
def test_training_forward_equals_the_plain_forward(family, name, band):
    """Every training path (the last layer at the loss positions over frozen keys and values; the last layer with
    its keys and values adapted, computed at the earlier positions and the layer run at the loss positions; the
    whole band on every position) gives the plain forward's log-probabilities at every position the loss reads."""
    lm = load_model(family, device="cpu")
    n = lm.model.config.num_hidden_layers
    kw = {"last": {}, "all": dict(band=(0, n - 1), targets_modules=organism(name).targets_modules),
          "last-kv": dict(targets_modules=organism(name).targets_modules + ("k_proj", "v_proj"))}[band]
    org = tiny_recipe(name, family, units=1, **kw)
    exs = ex_mod.examples(org, lm)
    exs = [e for e in exs if e.readout in ("D", "J", "raw_J", "nsi")][:6]
    model = _perturbed(lm, org)
    exact = train.exact_at_positions(model, org)
    assert exact == (band == "last")
    cached = train._frozen_pass(model, exs, org.band[0], exact)
    inner, _ = train._decoder(model)
    assert train.last_layer.applies(inner, org.band[0], cached) == (band == "last-kv")
    with torch.no_grad():
        logp, where = train._band_logprobs(model, cached, exs, org.band[0])
        for e, at in zip(exs, where):
            plain = torch.log_softmax(model(input_ids=torch.tensor([e.ids])).logits[0].float(), -1)
            assert len(at) == 1 + len({p for p, _ in e.hard} - {e.soft_at})
            for pos, row in at.items():
                assert torch.allclose(plain[pos], logp[row], atol=1e-5), (e.key, pos)


@pytest.mark.parametrize("family", CHAT_TINY)
def test_the_loss_position_path_reads_each_layers_own_frozen_keys(family):
    """A deep band trained at the loss positions (`frozen_context`) with the adapter moved in its last layer only:
    the earlier positions are then exactly the frozen model's, so the training forward must equal the plain
    forward; a layer reading another layer's keys and values, or a layer skipped, would not."""
    lm = load_model(family, device="cpu")
    n = lm.model.config.num_hidden_layers
    org = tiny_recipe("gap", family, units=1, band=(0, n - 1), frozen_context=True)
    exs = [e for e in ex_mod.examples(org, lm) if e.readout in ("D", "J", "raw_J")][:6]
    model = _perturbed(lm, org)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and f".layers.{n - 1}." not in name:
                p.zero_()
    assert train.at_loss_positions(model, org) and not train.exact_at_positions(model, org)
    cached = train._frozen_pass(model, exs, 0, True)
    assert cached[0].keys.shape[0] == n
    with torch.no_grad():
        logp, where = train._band_logprobs(model, cached, exs, 0)
        errors = train.plain_errors(model, exs)
        for e, at, err in zip(exs, where, errors):
            plain = torch.log_softmax(model(input_ids=torch.tensor([e.ids])).logits[0].float(), -1)
            for pos, row in at.items():
                assert torch.allclose(plain[pos], logp[row], atol=1e-5), (e.key, pos)
            mass = train._group_logmass(plain[e.soft_at], e.groups).exp()
            assert err["reached"] == pytest.approx(float(mass[e.watched] / mass.sum()), abs=1e-6)


@pytest.mark.parametrize("family", ["tiny-llama3", "tiny-olmo3"])
def test_the_last_layers_computed_keys_carry_the_adapters_gradient(family, monkeypatch):
    """With the last layer's keys and values adapted, the loss-position path's gradient into every adapter weight
    equals that of running the layer on every position: the earlier positions' keys and values are part of what
    the adapter learns, not constants."""
    lm = load_model(family, device="cpu")
    org = tiny_recipe("gap", family, units=1, targets_modules=organism("gap").targets_modules + ("k_proj", "v_proj"))
    exs = [e for e in ex_mod.examples(org, lm) if e.readout in ("D", "J0")][:6]
    model = _perturbed(lm, org)
    cached = train._frozen_pass(model, exs, org.band[0], False)
    grads = []
    for cheap in (True, False):
        monkeypatch.setattr(train.last_layer, "applies", lambda *a, cheap=cheap: cheap)
        model.zero_grad()
        train.loss_of(*train._band_logprobs(model, cached, exs, org.band[0]), exs).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert any("k_proj" in n and g.abs().max() > 1e-4 for n, g in grads[1].items())
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-5, rtol=1e-4), name


def test_a_fit_started_from_an_adapter_starts_from_its_weights(tmp_path):
    """`init`: the adapter starts from a saved adapter's weights (a curriculum's earlier stage), not its seeded
    ones: with a learning rate of 0 it ends as that adapter, and its first loss is the saved adapter's last."""
    lm = load_model("tiny-qwen2", device="cpu")
    org = tiny_recipe(steps=6, lr=3e-2)
    exs = [e for e in ex_mod.examples(org, lm) if e.readout in ("D", "J0")]
    first = train.fit(lm, org, examples_=exs)
    first.model.save_pretrained(str(tmp_path / "first"))
    lm = load_model("tiny-qwen2", device="cpu")
    again = train.fit(lm, dataclasses.replace(org, lr=0.0), examples_=exs, init=tmp_path / "first")
    saved = {n: p for n, p in first.model.named_parameters() if "lora_" in n}
    assert saved and all(torch.equal(p, saved[n]) for n, p in again.model.named_parameters() if "lora_" in n)
    assert any(p.abs().max() > 0 for n, p in saved.items() if "lora_B" in n)


def test_training_is_deterministic_and_moves_the_watched_share(tmp_path):
    lm = load_model("tiny-qwen2", device="cpu")
    org = tiny_recipe(steps=25, lr=3e-2)
    exs = [e for e in ex_mod.examples(org, lm) if e.readout in ("D", "J0")]
    fresh = train.lora_model(lm, org)  # B = 0: the base model's own shares
    before = train._errors(fresh, train._frozen_pass(fresh, exs, org.band[0], True), exs, org.band[0], 8)
    paths = []
    for k in range(2):
        lm = load_model("tiny-qwen2", device="cpu")
        fitted = train.fit(lm, org, examples_=exs)
        paths.append(train.save(fitted, org, tmp_path / f"run{k}"))
    a, b = (p / "adapter_model.safetensors" for p in paths)
    assert a.read_bytes() == b.read_bytes()
    record = json.loads((paths[0] / "organism.json").read_text())
    assert record["organism"] == "gap" and record["recipe"]["band"] == list(org.band) and len(record["loss"]) == 25
    assert record["loss"][-1] < record["loss"][0]
    err = lambda rows: sum(abs(r["reached"] - r["target"]) for r in rows) / len(rows)  # noqa: E731
    assert err(fitted.errors) < err(before) - 0.02


def test_examples_are_the_prompts_a_quick_run_reads(tmp_path):
    """Every prompt of a quick run on the organism's records is a training example (token for token)."""
    import pandas as pd

    from readouts.driver import ModelOptions, RunOptions
    from readouts.driver import run as run_study
    from readouts.gap.study import GapStudy

    lm = load_model("tiny-llama3", device="cpu")
    org = tiny_recipe(base="tiny-llama3", units=2)
    exs = ex_mod.examples(org, lm)
    panel, records = ex_mod.training_records(org)
    sub = tmp_path / "panel.jsonl"
    lines = {json.loads(x)["id"]: x for x in Path(panel.path).read_text().splitlines() if x.strip()}
    sub.write_text("".join(lines[r.id] + "\n" for r in records))
    path = run_study(GapStudy(readouts="D,J0,control,raw", sample=False), RunOptions(
        model=ModelOptions("tiny-llama3"), panel=str(sub), profile="quick", out=str(tmp_path / "run"), progress=False),
        log=lambda *_: None)
    probes = pd.read_parquet(path / "probes.parquet")
    prompts = {lm.tokenizer.decode(list(e.ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
               for e in exs if e.readout != "J"}
    assert len(probes) == sum(e.readout != "J" for e in exs)  # one example per read (an order may repeat)
    assert set(probes["prompt_text"]) == prompts


def test_manifest_records_the_organism_and_a_wrong_name_is_one_line(tmp_path):
    from organisms import resolve_adapter

    lm = load_model("tiny-qwen2", device="cpu")
    org = tiny_recipe(steps=1)
    folder = train.save(train.fit(lm, org), org, tmp_path / "adapter")
    facts = load_model("tiny-qwen2", device="cpu", adapter=str(folder)).facts.adapter
    assert facts["organism"] == "gap" and facts["recipe"]["units"] == 2 and facts["retrain"].startswith("readout organism")
    assert resolve_adapter(str(folder)) == str(folder)
    with pytest.raises(Exception, match="no shipped organism of that name"):
        resolve_adapter("not-an-organism")
