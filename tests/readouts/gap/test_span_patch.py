"""Patching by group of positions between a scenario's pressure prompt and its twin (readouts/gap/span_patch.py):
the engine's several-position patch against plain forwards of other inputs (substituted tokens; a whole source
stream), the pairing on hand-made token ids, and on SmolLM2 the reads whose answers are known without the code
under test (a scenario whose two sentences have the same token length: its span patched at depth 0 is a plain
forward of the twin)."""

import math

import pytest
import torch

from contract.names import PATCH_GROUPS
from engine.residuals import Patch, n_depths, patched_reads, streams
from panels.schema import load_panel, resolve_panel
from readouts.gap.profile import PROFILES
from readouts.gap.span_patch import AGENT_FRAME, filler_partner, logit_difference, pair_positions, pair_prompts, patch_grid
from tests.helpers import TINY, get_model

TOL = 1e-4


def plain_last(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0, -1].float()


@pytest.mark.parametrize("name", TINY)
def test_a_patch_of_several_positions_is_a_plain_forward(name):
    lm = get_model(name)
    model, vocab = lm.model, lm.model.config.vocab_size
    ids = tuple((7 * t + 3) % (vocab - 10) + 5 for t in range(24))
    other = tuple((11 * t + 1) % (vocab - 10) + 5 for t in range(24))
    at = (4, 5, 6, 15)
    substituted = tuple(other[i] if i in at else t for i, t in enumerate(ids))
    source = streams(model, other)
    d_last = n_depths(model) - 1
    patches = [Patch(0, source[0, list(at)], position=at)]  # embeddings of other tokens: the substituted prompt
    patches += [Patch(d, source[d], position=tuple(range(24))) for d in (0, 1, d_last)]  # every position: the source
    got = patched_reads(model, ids, patches, rows=2)
    assert (got[0] - plain_last(model, substituted)).abs().max() < TOL
    for row in got[1:]:
        assert (row - plain_last(model, other)).abs().max() < TOL


def test_pairing_by_hand():
    #            prefix    span (3 | 2)   context  options       context  read
    primary = (1, 2, 3, 40, 41, 42, 9, 60, 61, 62, 8, 7)
    twin = (1, 2, 3, 50, 51, 9, 60, 61, 62, 8, 7)
    rotated = (1, 2, 3, 40, 41, 42, 9, 61, 62, 60, 8, 7)
    p = pair_positions(primary, twin, rotated)
    assert p.unpaired == 1
    assert p.groups["span"] == ((4, 5), (3, 4))  # paired from the end: 41-42 with 50-51; 40 has no partner
    assert p.groups["options"] == ((7, 8, 9), (6, 7, 8))
    assert p.groups["context"] == ((6, 10), (5, 9))
    assert p.groups["read"] == ((11,), (10,))
    with pytest.raises(ValueError, match="do not differ"):
        pair_positions(primary, primary, rotated)


def test_logit_difference_by_hand():
    assert logit_difference((0.5, 0.25, 0.125), 0) == pytest.approx(math.log(0.5) - (math.log(0.25) + math.log(0.125)) / 2)
    assert math.isnan(logit_difference((0.5, 0.0, 0.2), 1))


@pytest.mark.smollm
def test_the_grid_on_smollm2_against_plain_forwards():
    lm = get_model("smollm2-135m")
    frames = PROFILES["quick"].frames
    last = n_depths(lm.model) - 1
    equal = None
    for s in load_panel(resolve_panel("gap-v2")).records:
        order = tuple(range(len(s.options)))
        primary, twin, rotated, _ = pair_prompts(lm.tokenizer, s, order, frames)
        if len(primary) == len(twin):
            equal = (s, order, twin)
            break
    assert equal is not None
    s, order, twin = equal
    rows = patch_grid(lm, s, order, frames, [0, last])
    at = {(r["direction"], r["group"], r["layer"]): r for r in rows}
    assert {g for _, g, _ in at} == set(PATCH_GROUPS) and rows[0]["unpaired"] == 0
    noised = at[("noising", "span", 0)]
    r = pair_prompts(lm.tokenizer, s, order, frames)[3]
    probs = plain_last(lm.model, twin).softmax(-1)
    mass = [float(probs[list(forms)].sum()) for forms in lm.letters(r.letters).token_ids]
    twin_ld = logit_difference(mass, r.letters.index(r.violating_letter))
    assert noised["ld"] == pytest.approx(twin_ld, abs=TOL) and noised["ld_source"] == pytest.approx(twin_ld, abs=TOL)
    for direction in ("noising", "denoising"):
        assert at[(direction, "read", last)]["ld"] == pytest.approx(at[(direction, "read", last)]["ld_source"], abs=TOL)
        for group in ("span", "options", "context"):  # past the last layer, only the read position reaches the letters
            assert at[(direction, group, last)]["ld"] == pytest.approx(at[(direction, group, last)]["ld_clean"], abs=TOL)
        for group in ("options", "context", "read"):  # the same tokens: the same embeddings
            assert at[(direction, group, 0)]["ld"] == pytest.approx(at[(direction, group, 0)]["ld_clean"], abs=TOL)


@pytest.mark.smollm
def test_the_filler_swap_control_reads_the_twin_with_another_scenarios_filler():
    """The control pair: its first prompt is the twin, its second the twin's chat with the partner's filler sentence
    put in by hand; its unpatched reads are plain forwards of those two, and at the last layer the read position's
    patch is the other prompt's read."""
    from dataclasses import replace

    from engine.render import encode_prompt
    from panels.frames import render
    from readouts.gap.prompts import prompt_of

    lm = get_model("smollm2-135m")
    frames = PROFILES["quick"].frames
    last = n_depths(lm.model) - 1
    records = load_panel(resolve_panel("gap-v2")).records[:3]
    s = records[0]
    partner = filler_partner(records, s)
    assert partner is records[1] and partner.filler != s.filler
    order = tuple(range(len(s.options)))
    twin = prompt_of(render(s, AGENT_FRAME, "twin", order, frames))
    assert s.filler in "".join(m["content"] for m in twin.messages)
    by_hand = replace(twin, messages=tuple({**m, "content": m["content"].replace(s.filler, partner.filler)}
                                           for m in twin.messages))
    first, second, _, r = pair_prompts(lm.tokenizer, s, order, frames, "filler_swap", partner.filler)
    assert first == tuple(encode_prompt(lm.tokenizer, twin)) and second == tuple(encode_prompt(lm.tokenizer, by_hand))
    rows = patch_grid(lm, s, order, frames, [last], pair="filler_swap", partner=partner)
    v = r.letters.index(r.violating_letter)

    def ld(ids):
        probs = plain_last(lm.model, ids).softmax(-1)
        return logit_difference([float(probs[list(f)].sum()) for f in lm.letters(r.letters).token_ids], v)

    at = {(x["direction"], x["group"]): x for x in rows}
    assert {x["pair"] for x in rows} == {"filler_swap"} and {x["filler_of"] for x in rows} == {partner.id}
    assert at[("noising", "read")]["ld_clean"] == pytest.approx(ld(first), abs=TOL)
    assert at[("noising", "read")]["ld_source"] == pytest.approx(ld(second), abs=TOL)
    for direction in ("noising", "denoising"):
        assert at[(direction, "read")]["ld"] == pytest.approx(at[(direction, "read")]["ld_source"], abs=TOL)
