"""generate(length_of=...): a tied prompt's rollouts are generated to exactly the length of its leader's
rollouts (same rollout index), whether the leader ends its turn or runs into its budget, and the leader's
own rollouts are what they are untied."""

import itertools

import pytest

from engine.generation import generate, stop_token_ids
from engine.render import Prompt, encode_prompt
from tests.helpers import get_model

QUESTIONS = [
    "Which is right, A or B? Explain, then end with Answer: <letter>.",
    "Restate the situation in your own words, listing the people it mentions.",
    "Count to five, then explain why the sky is blue in some detail, please.",
    "Pick one: A) stay B) go C) wait",
    "Say hello.",
]


def prompts_for(lm):
    return [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": q},))) for q in QUESTIONS]


def _stops(lm, ps):
    """Stop ids that end the leader (prompt 0) at some token a and would end the follower (prompt 1) at an
    earlier token b untied; returns them, a, b and the free (stop-less) greedy texts."""
    free = generate(lm.model, ps[:2], max_new_tokens=16, stop_ids=frozenset())
    lead, follow = free[0][0].tokens, free[1][0].tokens
    for a, b in itertools.product(range(4, 12), range(4)):
        s = {lead[a], follow[b]}
        if b < a and not s & set(lead[:a]) and not s & set(follow[:b]):
            return frozenset(s), a, b, free
    pytest.skip("this tiny model's greedy texts repeat every candidate stop token")


@pytest.mark.parametrize("name", ["tiny-llama3", "tiny-olmo3"])
def test_tied_rollout_has_its_leaders_length_when_the_leader_stops(name):
    lm = get_model(name)
    ps = prompts_for(lm)
    stop, a, b, free = _stops(lm, ps)
    untied = generate(lm.model, ps[:2], max_new_tokens=16, stop_ids=stop)
    assert untied[0][0].stopped and len(untied[0][0].tokens) == a
    assert untied[1][0].stopped and len(untied[1][0].tokens) == b  # on its own it would end earlier
    tied = generate(lm.model, ps[:2], max_new_tokens=16, stop_ids=stop, length_of=[None, 0])
    assert tied[0] == untied[0]  # the leader is untouched
    lead, follow = tied[0][0], tied[1][0]
    assert len(follow.tokens) == len(lead.tokens) == a
    assert not follow.stopped and not set(follow.tokens) & stop
    assert follow.tokens[:b] == free[1][0].tokens[:b]  # same text up to where it would have ended


@pytest.mark.parametrize("compact", [True, False])
def test_tied_sampled_rollouts_match_by_index_at_budget_and_at_stop(compact):
    lm = get_model("tiny-llama3")
    ps = prompts_for(lm)
    stop = stop_token_ids(lm.tokenizer, lm.model) | _stops(lm, ps)[0]  # some rollouts stop, some hit the budget
    kw = dict(stop_ids=stop, n=3, greedy_first=True, temperature=0.9, top_p=0.95, seeds=[1, 2, 3, 4, 5],
              compact=compact)
    budgets = [9, 16, 12, 5, 16]
    ties = [None, 0, None, 2, None]  # prompt 1 follows 0, prompt 3 (budget 5) follows 2 (budget 12)
    untied = generate(lm.model, ps, max_new_tokens=budgets, **kw)
    tied = generate(lm.model, ps, max_new_tokens=budgets, length_of=ties, **kw)
    for i in (0, 2, 4):
        assert tied[i] == untied[i]
    for j in range(3):
        assert len(tied[1][j].tokens) == len(tied[0][j].tokens)
        assert len(tied[3][j].tokens) == min(5, len(tied[2][j].tokens))  # its own budget comes first
    assert any(r.stopped for r in tied[0] + tied[2]) and any(not r.stopped for r in tied[0] + tied[2])
    # one row per batch: the pair still decodes together
    alone = generate(lm.model, ps, max_new_tokens=budgets, length_of=ties, max_rows=6, **kw)
    assert alone == tied


def test_length_of_is_checked():
    lm = get_model("tiny-qwen2")
    ps = prompts_for(lm)[:3]
    for bad in ([None, 0], [None, 1, None], [1, 0, None], [None, 5, None]):
        with pytest.raises(ValueError, match="length_of"):
            generate(lm.model, ps, max_new_tokens=4, stop_ids=frozenset(), length_of=bad)


def test_many_tied_pairs_through_compaction():
    lm = get_model("tiny-olmo3")
    ps = prompts_for(lm)
    free = generate(lm.model, ps, max_new_tokens=8, stop_ids=frozenset())
    stop = frozenset(r[0].tokens[3] for r in free)
    leaders = list(itertools.islice(itertools.cycle(ps), 8))
    followers = list(reversed(leaders))
    out = generate(lm.model, leaders + followers, max_new_tokens=10, stop_ids=stop, n=2, temperature=0.8,
                   seeds=list(range(16)), length_of=[None] * 8 + list(range(8)))
    lengths = [[len(r.tokens) for r in rs] for rs in out]
    assert lengths[8:] == lengths[:8]
    assert len({x for row in lengths[:8] for x in row}) > 1  # leaders end at different steps
