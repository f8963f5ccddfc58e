"""The served read against the local exact read of the same model: the embedded SmolLM2 served by the llama.cpp
server from its Q4_1 GGUF, and the engine's full-softmax read of that GGUF dequantized (engine/embedded.py),
on the same rendered prompts. The server renders the chat template itself; the test first holds its rendering
equal to the local one, then compares letter masses (D frame) and the decision words' masses (NSI continuous)
wherever they are inside the top k, and counts the reads where they are not (flagged, NaN)."""

import json
import math
import urllib.request

import numpy as np
import pytest

from contract.names import FRAMINGS
from engine.render import Prompt, encode_prompt
from engine.scoring import score_ids
from engine.served import ServedModel, ServedSpec, letter_forms, topk_mass
from panels.frames import render, render_polarity
from panels.orders import option_orders
from panels.schema import load_panel
from readouts.gap.served import messages_of
from readouts.nsi.served import word_match
from readouts.nsi.study import DECISION_PREFIX, DECISION_WORDS, MIN_WORD_START, decision_words
from tests.conftest import get_model
from tests.served_helpers import LlamaServer, require_binary

pytestmark = pytest.mark.smollm
TOLERANCE = 0.05
"""Largest |served - local| mass accepted on a token set inside the top k: the server computes with the Q4_1
weights and 8-bit-quantized activations in its dot products, the engine with the dequantized weights in bf16,
fp32 arithmetic."""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from engine.embedded import gguf_path

    s = LlamaServer(require_binary(), gguf_path(), log=tmp_path_factory.mktemp("llama") / "server.log")
    s.start()
    yield s, ServedModel(ServedSpec(name="smollm2", url=s.url, cache=str(tmp_path_factory.mktemp("cache"))))
    s.stop()


def _server_render(url: str, messages) -> str:
    req = urllib.request.Request(url.removesuffix("/v1") + "/apply-template", data=json.dumps({"messages": messages}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["prompt"]


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
    local_text = tok.apply_chat_template(msgs[0], tokenize=False, add_generation_prompt=True)
    assert _server_render(server.url, msgs[0]) == local_text  # the same rendered prompt on both sides
    ids = [tuple(encode_prompt(tok, Prompt(messages=r.messages, system=r.system))) for r in prompts]
    local = score_ids(lm.model, ids, [lm.letters(r.letters) for r in prompts], pad_id=lm.pad_id)
    replies = sm.read([(m, None) for m in msgs])
    served_l = [topk_mass(rep.tokens[0].top, letter_forms(r.letters), r.letters).mass for rep, r in zip(replies, prompts)]
    d_diff, d_out = _compare(served_l, [res.mass for res in local])

    dilemmas = load_panel("nsi-14").records[:3]
    cells = [render_polarity(d, f) for d in dilemmas for f in FRAMINGS]
    words = decision_words(tok)
    prefix = tuple(tok.encode(DECISION_PREFIX, add_special_tokens=False))
    local_w = score_ids(lm.model, [tuple(encode_prompt(tok, Prompt(messages=p.messages))) + prefix for p in cells],
                        [words] * len(cells), pad_id=lm.pad_id)
    replies = sm.read([(list(p.messages), DECISION_PREFIX) for p in cells])
    match = word_match(DECISION_WORDS, MIN_WORD_START)
    served_w = [topk_mass(rep.tokens[0].top, [[w] for w in DECISION_WORDS], DECISION_WORDS, match=match).mass for rep in replies]
    w_diff, w_out = _compare(served_w, [res.mass for res in local_w])
    print(f"\nagreement D letters: {len(d_diff)} masses inside the top k over {len(prompts)} reads, max |diff| "
          f"{d_diff.max():.4f}, median {np.median(d_diff):.4f}; reads with a letter outside: {d_out}")
    print(f"agreement NSI words: {len(w_diff)} masses over {len(cells)} reads, max |diff| {w_diff.max():.4f}, "
          f"median {np.median(w_diff):.4f}; reads with a word outside: {w_out}")
    assert len(d_diff) >= len(prompts) and len(w_diff) >= len(cells)
    assert d_diff.max() < TOLERANCE and w_diff.max() < TOLERANCE
