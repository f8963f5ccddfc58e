"""Reads after the anchor from the rows' own caches (engine/rowcache.py): each finished row's keys/values are
kept, and a read runs only the tokens past them. Equal, on every tiny family, to re-encoding prompt and text
(the fast path without row caches) and to the plain one-prompt forward; a row whose cache was not kept is
re-encoded."""

import pytest

from engine.anchor import anchor_read
from engine.generation import generate, stop_token_ids
from engine.render import Prompt, encode_prompt
from engine.rowcache import RowCaches
from engine.scoring import ScoreStats, score_ids
from tests.helpers import TINY, get_model


def _diff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.mass, rb.mass))


def _reads(lm, prompts, rollouts):
    """Per rollout: the anchor rule's read (forced after the text), one cut inside the generated text (where the
    model's own anchor would stand) and that cut with the suffix appended."""
    suffix = lm.tokenizer.encode("\nAnswer:", add_special_tokens=False)
    out = []
    for p, rs in zip(prompts, rollouts):
        for r in rs:
            out.append(anchor_read(lm.tokenizer, p, r).ids)
            k = max(1, len(r.tokens) // 2)
            out.append(tuple(p) + r.tokens[:k])
            out.append(tuple(p) + r.tokens[:k] + tuple(suffix))
    return out


@pytest.mark.parametrize("name", TINY)
def test_reads_from_row_caches_equal_reencoding(name):
    lm = get_model(name)
    prompts = [encode_prompt(lm.tokenizer, Prompt(text=f"Case {i}: which option, A or B? " + "Think. " * (2 * i)))
               for i in range(2)]
    store = RowCaches()
    rollouts = generate(lm.model, prompts, max_new_tokens=[9, 5], stop_ids=stop_token_ids(lm.tokenizer, lm.model),
                        n=2, greedy_first=True, temperature=0.8, seeds=[1, 2], row_kv=store)
    assert store.rows_held == sum(1 for rs in rollouts for r in rs if len(r.tokens) > 1)
    reads = _reads(lm, prompts, rollouts)
    letters = [lm.letters("AB")] * len(reads)
    plain = score_ids(lm.model, reads, letters, fast=False)
    again = score_ids(lm.model, reads, letters, prefix_reuse=False)
    stats = ScoreStats()
    cached = score_ids(lm.model, reads, letters, known_prefixes=store, stats=stats)
    assert _diff(plain, cached) < 1e-5 and _diff(again, cached) < 1e-5
    # Only what lies past each row's held tokens ran: the suffix, the last token, or a budget-cut row's last token.
    assert stats.computed_tokens == sum(len(s) - store.longest_prefix(s) for s in set(reads))
    # ... which is less than half of what reading on the prompts' caches alone runs.
    past_prompt = sum(len(s) - len(p) for s in set(reads) for p in prompts if tuple(s[: len(p)]) == tuple(p))
    assert stats.computed_tokens < past_prompt / 2


def test_rows_over_the_limit_are_reencoded():
    lm = get_model("tiny-qwen2")
    prompts = [encode_prompt(lm.tokenizer, Prompt(text=f"Case {i}: A or B?")) for i in range(2)]
    store = RowCaches(limit_bytes=1)  # no row fits
    rollouts = generate(lm.model, prompts, max_new_tokens=6, stop_ids=frozenset(), n=2, temperature=0.8, row_kv=store)
    assert store.rows_held == 0 and set(store) == {tuple(p) for p in prompts}
    reads = _reads(lm, prompts, rollouts)
    letters = [lm.letters("AB")] * len(reads)
    stats = ScoreStats()
    out = score_ids(lm.model, reads, letters, known_prefixes=store, stats=stats)
    assert _diff(score_ids(lm.model, reads, letters, fast=False), out) < 1e-5
    assert stats.computed_tokens == sum(len(s) - len(p) for s in set(reads) for p in prompts if tuple(s[: len(p)]) == tuple(p))


@pytest.mark.smollm
def test_smollm2_reads_from_row_caches(models):
    lm = models("smollm2-135m")
    prompts = [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": "Pick A or B, then write Answer: and the letter."},)))]
    store = RowCaches()
    rollouts = generate(lm.model, prompts, max_new_tokens=10, stop_ids=stop_token_ids(lm.tokenizer, lm.model), n=2,
                        greedy_first=True, temperature=0.7, top_p=0.95, row_kv=store)
    reads = _reads(lm, prompts, rollouts)
    letters = [lm.letters("AB")] * len(reads)
    assert _diff(score_ids(lm.model, reads, letters, prefix_reuse=False),
                 score_ids(lm.model, reads, letters, known_prefixes=store)) < 1e-4


def test_row_caches_from_doubling_static_buffers(monkeypatch):
    """Rows decoded with static shapes whose own buffers doubled (from 2 tokens) hand over the same keys/values:
    reads on them equal the plain one-prompt forward."""
    import engine.decode as decode

    monkeypatch.setattr(decode, "OWN_BLOCK", 2)
    lm = get_model("tiny-olmo3")
    prompts = [encode_prompt(lm.tokenizer, Prompt(text=f"Case {i}: which option, A or B? " + "Think. " * (2 * i)))
               for i in range(2)]
    store = RowCaches()
    rollouts = generate(lm.model, prompts, max_new_tokens=[9, 5], stop_ids=frozenset(), n=2, greedy_first=True,
                        temperature=0.8, seeds=[1, 2], row_kv=store, static_shapes=True)
    assert store.rows_held == 4
    reads = _reads(lm, prompts, rollouts)
    letters = [lm.letters("AB")] * len(reads)
    assert _diff(score_ids(lm.model, reads, letters, fast=False), score_ids(lm.model, reads, letters, known_prefixes=store)) < 1e-5
