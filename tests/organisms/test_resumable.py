"""Resumable organism training on a tiny model: a run stopped after a checkpoint and resumed ends with the bytes, the
losses and the lineage of a run never stopped; a checkpoint of another recipe is not resumed."""

import copy
import dataclasses
import functools

import pytest
import torch

from engine.loading import load_model
from organisms import examples as ex_mod
from organisms import resumable, train
from tests.helpers import tiny_recipe


class Stop(Exception):
    pass


@functools.cache
def _base():
    return load_model("tiny-qwen2", device="cpu")


def _fresh():
    """The tiny base model with its own copy of the weights (the adapter is put into the module it wraps)."""
    lm = _base()
    return dataclasses.replace(lm, model=copy.deepcopy(lm.model))


def _examples(org, lm):
    exs = ex_mod.examples(org, lm)
    return [e for e in exs if e.readout == "D"][:3] + [e for e in exs if e.readout == "J"][:1]


def _run(org, folder, out, stop_at=None, resume=True):
    lm = _fresh()
    exs = _examples(org, lm)

    def progress(step, loss):
        if step == stop_at:
            raise Stop

    fitted = resumable.fit_resumable(lm, org, folder, exs=exs, every=2, resume=resume, progress=progress)
    return fitted, train.save(fitted, org, out)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stopped_run_resumes_to_the_same_adapter(tmp_path, stream):
    n = _base().model.config.num_hidden_layers
    org = tiny_recipe(units=1, steps=4, batch=2, lr=3e-2, lineage=3, stream=stream, band=(n - 2, n - 1),
                      targets_modules=("q_proj", "k_proj", "v_proj", "o_proj", "down_proj"))
    assert resumable.lineage_steps(org) == [0, 2, 4]
    whole, a = _run(org, tmp_path / "ckpt-a", tmp_path / "a")
    with pytest.raises(Stop):
        _run(org, tmp_path / "ckpt-b", tmp_path / "b", stop_at=2)  # steps 0-2 done, the checkpoint holds 2
    assert sorted(p.name for p in (tmp_path / "ckpt-b" / "lineage").iterdir()) == ["checkpoint-0", "checkpoint-2"]
    resumed, b = _run(org, tmp_path / "ckpt-b", tmp_path / "b")
    assert resumed.losses == whole.losses and len(whole.losses) == 4
    assert (a / "adapter_model.safetensors").read_bytes() == (b / "adapter_model.safetensors").read_bytes()
    from readouts.watch import scan

    found = scan(tmp_path / "ckpt-a" / "lineage", settle=0)  # what `readout watch` reads: adapters on their base
    assert [(f.step, f.kind, f.problem) for f in found] == [(k, "adapter", None) for k in (0, 2, 4)]
    for k in (0, 2, 4):
        one, two = (tmp_path / c / "lineage" / f"checkpoint-{k}" / "adapter_model.safetensors" for c in ("ckpt-a", "ckpt-b"))
        assert one.read_bytes() == two.read_bytes()
    other = dataclasses.replace(org, lr=1e-2, steps=2)  # another recipe: starts afresh, whatever the folder holds
    lines = []
    lm = _fresh()
    exs = _examples(other, lm)
    fresh = resumable.fit_resumable(lm, other, tmp_path / "ckpt-b", exs=exs, every=2, log=lines.append)
    assert len(fresh.losses) == 2 and fresh.losses[0] == whole.losses[0] and fresh.losses[1] != whole.losses[1]
    assert any("starting afresh" in line for line in lines)


def test_the_frozen_layers_cache_resumes_from_its_last_file(tmp_path, monkeypatch):
    """The frozen pass is written a shard at a time: stopped after the first shard, a second call computes only the
    examples not yet written, and every example's cached states equal an uncached pass."""
    monkeypatch.setenv("LOGIT_READOUT_CACHE", str(tmp_path))
    monkeypatch.setattr(train, "SHARD", 2)
    n = _base().model.config.num_hidden_layers
    org = tiny_recipe(units=1, band=(n - 2, n - 1), targets_modules=("q_proj", "k_proj", "v_proj"))
    lm = _fresh()
    exs = _examples(org, lm)
    model = train.lora_model(lm, org)
    plain = train._frozen_pass(model, exs, n - 2, False)
    real, asked = train._frozen_pass, []

    def counted(model_, part, *args):
        asked.append(len(part))
        if len(asked) == 2:
            raise Stop
        return real(model_, part, *args)

    monkeypatch.setattr(train, "_frozen_pass", counted)
    with pytest.raises(Stop):
        train.frozen_states(model, exs, n - 2, False, "tiny")
    assert asked == [2, 2] and len(list((tmp_path / "organisms").glob("frozen-*/*.pt"))) == 1
    asked.clear()
    lines = []
    got = train.frozen_states(model, exs, n - 2, False, "tiny", lines.append)
    assert asked == [len(exs) - 2] and len(lines) == 1
    for a, b in zip(got, plain):
        assert a.start == b.start and torch.equal(a.hidden, b.hidden)
    asked.clear()
    train.frozen_states(model, exs, n - 2, False, "tiny")
    assert asked == []


@pytest.mark.parametrize("exact", [False, True])
def test_the_frozen_pass_runs_a_shared_prefix_once_and_gives_the_same_states(monkeypatch, exact):
    """Prompts that share their start (the option orders of a cell) run it once, their suffixes over its keys and
    values: every state and cached key and value equals the pass that runs each prompt whole."""
    n = _base().model.config.num_hidden_layers
    org = tiny_recipe(units=1, band=(n - 1, n - 1))
    lm = _fresh()
    exs = ex_mod.examples(org, lm)[:24]
    model = train.lora_model(lm, org)
    shared, alone = train._prefix_groups(exs, exact)
    assert shared and sum(len(m) for _, m in shared) + len(alone) == len(exs)
    assert all(c >= train.SHARED_PREFIX and len({tuple(exs[j].ids[:c]) for j in m}) == 1 for c, m in shared)
    got = train._frozen_pass(model, exs, n - 1, exact)
    with monkeypatch.context() as m:  # a group's suffixes in batches of one, each over its own copy of the prefix
        m.setattr(train, "CACHE_BATCH_TOKENS", 1)
        split = train._frozen_pass(model, exs, n - 1, exact)
    monkeypatch.setattr(train, "SHARED_PREFIX", 10**9)
    assert not train._prefix_groups(exs, exact)[0]
    whole = train._frozen_pass(model, exs, n - 1, exact)
    for a, b in [*zip(got, whole), *zip(split, whole)]:
        assert a.start == b.start and a.hidden.shape == b.hidden.shape
        assert torch.allclose(a.hidden, b.hidden, atol=1e-5)
        if exact:
            assert torch.allclose(a.keys, b.keys, atol=1e-5) and torch.allclose(a.values, b.values, atol=1e-5)


def test_a_staged_recipe_starts_from_its_earlier_stages_shipped_adapter(tmp_path, monkeypatch):
    """`init`: the recipe's adapter starts from the shipped adapter of the organism it names (with a learning rate of
    0 it ends as that adapter), whose bytes are part of the run's identity; without that adapter on disk the run stops
    with one line naming the missing file."""
    from engine.errors import ReadoutError

    monkeypatch.setattr(resumable, "SHIPPED", tmp_path / "shipped")
    first_org = tiny_recipe(units=1, steps=3, batch=2, lr=3e-2)
    first, _ = _run(first_org, tmp_path / "ckpt-first", tmp_path / "shipped" / "earlier")
    staged = dataclasses.replace(first_org, name="staged", init="earlier", lr=0.0, steps=2)
    again, _ = _run(staged, tmp_path / "ckpt-staged", tmp_path / "staged")
    saved = {n: p for n, p in first.model.named_parameters() if "lora_" in n}
    assert any(p.abs().max() > 0 for n, p in saved.items() if "lora_B" in n)
    assert all(torch.equal(p, saved[n]) for n, p in again.model.named_parameters() if "lora_" in n)
    exs = _examples(staged, _fresh())
    ident = resumable.identity(staged, exs)
    _run(dataclasses.replace(first_org, lr=1e-2), tmp_path / "ckpt-other", tmp_path / "shipped" / "earlier")
    assert resumable.identity(staged, exs) != ident  # a checkpoint of the stage does not resume over another start
    missing = dataclasses.replace(staged, init="absent")
    with pytest.raises(ReadoutError, match=r"absent/adapter_model.safetensors\); train that one first"):
        _run(missing, tmp_path / "ckpt-missing", tmp_path / "missing")
