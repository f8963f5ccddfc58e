"""Logits that are NaN or infinite stop the work with NonFiniteLogitsError instead of being drawn from or read: in the
decode loop (at the next check, on every decode path and tiny family, greedy and sampled), where letters are read
(letter_masses, score_ids); a row past its end is not checked (its logits are never used), and -inf on some tokens
(a mask) is not an error."""

import math

import pytest
import torch

import engine.decode as decode
import engine.dense_decode as dense_decode
from engine.errors import NonFiniteLogitsError
from engine.generation import generate
from engine.letters import LetterTokens
from engine.scoring import letter_masses, score_ids
from tests.helpers import PATHS, TINY, get_model, prompts_for, use_path

POISONS = {
    "nan": lambda row: row.index_fill_(0, torch.tensor([7]), float("nan")),
    "inf": lambda row: row.index_fill_(0, torch.tensor([7]), float("inf")),
    "all -inf": lambda row: row.fill_(float("-inf")),
}
MODES = {"greedy": dict(temperature=0.0), "T 0.7": dict(temperature=0.7, top_p=1.0), "T 0.7, top-p 0.9": dict(temperature=0.7, top_p=0.9)}


def poison(monkeypatch, prompt, rollout: int, at: int, spoil) -> None:
    """Both decode states return logits whose row of `prompt`'s rollout `rollout` is `spoil`ed at decoding step `at`
    (every time that step runs: a rewound window runs it again)."""
    for cls in (decode.Cascade, dense_decode.Dense):
        def step(self, tokens=None, _own=cls.step):
            at_step = self.step_index
            logits = _own(self, tokens)
            if at_step == at:
                rows = [r for r, p in enumerate(self.row_prompt[: logits.shape[0]]) if self.prompts[p] == list(prompt)]
                logits = logits.clone()
                spoil(logits[rows[rollout]])
            return logits
        monkeypatch.setattr(cls, "step", step)


def _generate(lm, path, monkeypatch, **kw):
    args = dict(max_new_tokens=8, stop_ids=frozenset(), n=2, seeds=[3, 4, 5], pad_id=lm.pad_id, compact=False, check_every=3)
    return generate(lm.model, prompts_for(lm, 3), **{**args, **use_path(monkeypatch, path), **kw})


@pytest.mark.parametrize("kind", sorted(POISONS))
@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", TINY)
def test_a_poisoned_step_stops_decoding(name, mode, kind, monkeypatch):
    lm = get_model(name)
    prompt = prompts_for(lm, 3)[1]
    poison(monkeypatch, prompt, 1, at=4, spoil=POISONS[kind])
    with pytest.raises(NonFiniteLogitsError, match=r"^decoding: .* NaN or infinite for 1 of 6 rows at a step between 3 "
                                                   rf"and 5 \(first: rollout 1 of a prompt of {len(prompt)} tokens\)"):
        _generate(lm, "flash", monkeypatch, **MODES[mode])


@pytest.mark.parametrize("path", PATHS)
def test_every_decode_path_checks(path, monkeypatch):
    lm = get_model("tiny-llama3")
    poison(monkeypatch, prompts_for(lm, 3)[2], 0, at=0, spoil=POISONS["nan"])  # the prompts' own last position
    with pytest.raises(NonFiniteLogitsError, match="between 0 and 2"):
        _generate(lm, path, monkeypatch, temperature=0.7)


@pytest.mark.parametrize("name", TINY)
def test_a_row_past_its_end_is_not_checked(name, monkeypatch):
    """Prompt 0 has a budget of 2 tokens: its rows choose tokens at steps 0 and 1 only. Poisoned at step 2 (past its
    end, before the check at step 2) the rollouts are the clean ones; poisoned at step 1, its last token, they stop."""
    lm = get_model(name)
    kw = dict(max_new_tokens=[2, 8, 8], temperature=0.7)
    clean = _generate(lm, "flash", monkeypatch, **kw)
    first = prompts_for(lm, 3)[0]
    poison(monkeypatch, first, 1, at=2, spoil=POISONS["nan"])
    assert _generate(lm, "flash", monkeypatch, **kw) == clean
    monkeypatch.undo()
    poison(monkeypatch, first, 1, at=1, spoil=POISONS["nan"])
    with pytest.raises(NonFiniteLogitsError, match="for 1 of 6 rows"):
        _generate(lm, "flash", monkeypatch, **kw)


@pytest.mark.parametrize("path", ["static", "dense"])
def test_the_check_follows_compaction_and_tied_rows(path, monkeypatch):
    """Prompt 0's rows (a budget of 2) leave the batch at the check after step 1 (on the static path: down to the bucket
    of 4); prompt 2's rollouts are tied to prompt 1's lengths. A NaN in prompt 2's rollout 1 at step 5 is found among
    the 4 rows left."""
    lm = get_model("tiny-llama3")
    kw = dict(max_new_tokens=[2, 8, 8], temperature=0.7, compact=True, check_every=1, length_of=[None, None, 1])
    poison(monkeypatch, prompts_for(lm, 3)[2], 1, at=5, spoil=POISONS["nan"])
    with pytest.raises(NonFiniteLogitsError, match=r"for 1 of 4 rows at a step between 5 and 5 \(first: rollout 1 of"):
        _generate(lm, path, monkeypatch, **kw)


def test_minus_inf_on_some_tokens_is_a_mask_not_an_error(monkeypatch):
    lm = get_model("tiny-qwen2")
    poison(monkeypatch, prompts_for(lm, 3)[1], 0, at=3, spoil=lambda row: row[::2].fill_(float("-inf")))
    out = _generate(lm, "flash", monkeypatch, temperature=0.0)
    assert out[1][0].tokens[3] % 2 == 1  # prompt 1's rollout 0 at step 3: one of the odd ids left


def _letters(ids):
    return LetterTokens(letters=tuple("AB"[: len(ids)]), token_ids=tuple((i,) for i in ids), decoded=tuple((str(i),) for i in ids))


def test_letter_masses_refuse_rows_that_are_not_finite():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    logits[1, 30] = float("nan")  # not a letter: the row's softmax is NaN all the same
    logits[2, 31] = float("inf")
    logits[3] = float("-inf")
    logits[4, 2:] = float("-inf")  # a mask on every token but the letters: their masses sum to 1
    letters = [_letters([0, 1])] * 5
    ok = letter_masses(logits[[0, 4]], letters[:2], [9, 9], 1.0, 1.0)
    e = logits[4, :2].double().exp()
    assert ok[1].mass == pytest.approx(tuple((e / e.sum()).tolist()), abs=1e-7) and math.isclose(ok[1].letter_mass, 1.0, abs_tol=1e-6)
    for row in (1, 2, 3):
        for temperature, top_p in ((0.7, 0.9), (0.0, 1.0)):  # at T 0 the tempered part is one-hot, finite all the same
            with pytest.raises(NonFiniteLogitsError, match=r"for 1 of 2 rows read together \(first: row 1, a prompt of 12 tokens\)"):
                letter_masses(logits[[0, row]], letters[:2], [9, 12], temperature, top_p)
    with pytest.raises(NonFiniteLogitsError, match=r"for 3 of 5 rows .*\(first: row 1\)"):
        letter_masses(logits, letters, [0] * 5, 1.0, 1.0)  # no prompt lengths (the lens reads): the row alone


def test_score_ids_on_a_model_that_overflows(monkeypatch):
    """A model whose embeddings of one token are infinite: a prompt holding it is refused, the others read."""
    lm = get_model("tiny-llama3")
    seqs = prompts_for(lm, 3)
    bad = next(t for t in seqs[2] if t not in seqs[0] and t not in seqs[1])
    letters = [lm.letters(("A", "B"))] * 3
    clean = score_ids(lm.model, seqs[:2], letters[:2])
    embed = lm.model.get_input_embeddings()
    saved = embed.weight[bad].clone()
    with torch.no_grad():
        embed.weight[bad] = float("inf")
    try:
        assert score_ids(lm.model, seqs[:2], letters[:2]) == clean
        with pytest.raises(NonFiniteLogitsError,
                           match=rf"^reading letters: the logits read were NaN or infinite .*first: row \d+, a prompt of {len(seqs[2])} tokens"):
            score_ids(lm.model, seqs, letters)
    finally:
        with torch.no_grad():
            embed.weight[bad] = saved
