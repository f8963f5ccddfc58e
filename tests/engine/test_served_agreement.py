"""The served read against the local exact read of the same model: the embedded SmolLM2 served by vLLM (CPU,
float32) from the engine's own dequantized copy of the Q4_1 GGUF (engine/embedded.py), and the engine's
full-softmax read of that copy, on the same prompts. The server renders the chat template itself; the test
first holds its token ids equal to the local ones (vLLM's /tokenize), then compares letter masses (D frame) and
the decision words' masses (NSI continuous, read after a prefilled assistant text) wherever they are inside the
top k, and counts the reads where they are not (flagged, NaN)."""

import math

import numpy as np
import pytest

from contract.names import FRAMINGS
from engine.render import Prompt, encode_prompt
from engine.scoring import score_ids
from engine.served import PREFILL_FIELDS, ServedModel, ServedSpec, letter_forms, topk_mass
from panels.frames import render, render_polarity
from panels.orders import option_orders
from panels.schema import load_panel
from readouts.gap.prompts import messages_of
from readouts.nsi.recipe import DECISION_PREFIX, DECISION_WORDS, MIN_WORD_START, decision_words
from readouts.nsi.served import word_match
from tests.helpers import get_model
from tests.served_helpers import SERVED_NAME, post

pytestmark = [pytest.mark.smollm, pytest.mark.served]
TOLERANCE = 1e-3
"""Largest |served - local| mass accepted on a token set inside the top k: both sides compute with the same
bf16 weights in float32 (vLLM's CPU kernels against torch's), so they differ only by summation order."""


@pytest.fixture(scope="module")
def served(served_server, tmp_path_factory):
    return served_server, ServedModel(ServedSpec(name=SERVED_NAME, url=served_server.url,
                                                 cache=str(tmp_path_factory.mktemp("cache"))))


def _server_ids(url: str, messages, prefill: str | None = None) -> list[int]:
    """The token ids the server feeds its model for `messages` (vLLM's /tokenize, its chat template)."""
    body = {"model": SERVED_NAME, "messages": list(messages), "add_generation_prompt": True}
    if prefill is not None:
        body = {**body, "messages": [*messages, {"role": "assistant", "content": prefill}], **PREFILL_FIELDS}
    return post(url, "/tokenize", body)["tokens"]


def _compare(served_mass, local_mass):
    """(absolute differences inside the top k, reads with a set outside)."""
    diffs, outside = [], 0
    for s, loc in zip(served_mass, local_mass):
        if any(math.isnan(x) for x in s):
            outside += 1
        diffs += [abs(a - b) for a, b in zip(s, loc) if not math.isnan(a)]
    return np.array(diffs), outside


def test_served_letter_and_word_masses_agree_with_the_local_exact_read(served):
    server, sm = served
    lm = get_model("smollm2-135m")
    tok = lm.tokenizer
    panel = load_panel("gap-v2").records[:4]
    prompts = []
    for s in panel:
        for order in option_orders(len(s.options), 2, 0, f"{s.id}|agreement"):
            prompts.append(render(s, "agent", "primary", order))
    msgs = [messages_of(r) for r in prompts]
    ids = [tuple(encode_prompt(tok, Prompt(messages=r.messages, system=r.system))) for r in prompts]
    assert [tuple(_server_ids(server.url, m)) for m in msgs] == ids  # the same prompt on both sides
    local = score_ids(lm.model, ids, [lm.letters(r.letters) for r in prompts], pad_id=lm.pad_id)
    replies = sm.read([(m, None) for m in msgs])
    served_l = [topk_mass(rep.tokens[0].top, letter_forms(r.letters), r.letters).mass for rep, r in zip(replies, prompts)]
    d_diff, d_out = _compare(served_l, [res.mass for res in local])

    dilemmas = load_panel("nsi-14").records[:3]
    cells = [render_polarity(d, f) for d in dilemmas for f in FRAMINGS]
    words = decision_words(tok)
    prefix = tuple(tok.encode(DECISION_PREFIX, add_special_tokens=False))
    ids_w = [tuple(encode_prompt(tok, Prompt(messages=p.messages))) + prefix for p in cells]
    assert [tuple(_server_ids(server.url, list(p.messages), DECISION_PREFIX)) for p in cells] == ids_w
    local_w = score_ids(lm.model, ids_w, [words] * len(cells), pad_id=lm.pad_id)
    replies = sm.read([(list(p.messages), DECISION_PREFIX) for p in cells])
    match = word_match(DECISION_WORDS, MIN_WORD_START)
    served_w = [topk_mass(rep.tokens[0].top, [[w] for w in DECISION_WORDS], DECISION_WORDS, match=match).mass for rep in replies]
    w_diff, w_out = _compare(served_w, [res.mass for res in local_w])
    print(f"\nagreement D letters: {len(d_diff)} masses inside the top k over {len(prompts)} reads, max |diff| "
          f"{d_diff.max():.1e}, median {np.median(d_diff):.1e}; reads with a letter outside: {d_out}")
    print(f"agreement NSI words: {len(w_diff)} masses over {len(cells)} reads, max |diff| {w_diff.max():.1e}, "
          f"median {np.median(w_diff):.1e}; reads with a word outside: {w_out}")
    assert len(d_diff) >= len(prompts) and len(w_diff) >= len(cells)
    assert d_diff.max() < TOLERANCE and w_diff.max() < TOLERANCE

    # The same reads with only the top 2 asked for: letters fall outside, and each is flagged, NaN (never zero),
    # and its exact local mass lies within the unseen remainder the server's reply bounds it by.
    narrow = ServedModel(ServedSpec(name=SERVED_NAME, url=server.url, top_logprobs=2, cache=str(sm.cache_dir / "k2")))
    flagged = 0
    for rep, r, res in zip(narrow.read([(m, None) for m in msgs]), prompts, local):
        m = topk_mass(rep.tokens[0].top, letter_forms(r.letters), r.letters)
        assert m.k == 2
        for i, letter in enumerate(r.letters):
            if letter in m.outside:
                flagged += 1
                assert math.isnan(m.mass[i]) and res.mass[i] <= m.unseen + TOLERANCE
            else:
                assert abs(m.mass[i] - res.mass[i]) < TOLERANCE
    print(f"top 2 only: {flagged} letter reads outside, flagged; each within its unseen bound")
    assert flagged > 0
