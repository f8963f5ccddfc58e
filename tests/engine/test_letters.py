"""Letters: single-token variants summed per letter, validated at load with errors naming the letter."""

import pytest

from engine.errors import LetterTokenError
from engine.letters import resolve_letters
from tests.helpers import SMOLLM2, TINY, get_model


@pytest.mark.parametrize("name", [*TINY, SMOLLM2])
def test_a_to_e_are_single_tokens(name):
    tok = get_model(name).tokenizer
    lt = resolve_letters(tok, "ABCDE")
    for letter, ids, texts in zip(lt.letters, lt.token_ids, lt.decoded):
        assert ids[0] == tok.encode(letter, add_special_tokens=False)[0]
        assert ids[1] == tok.encode(" " + letter, add_special_tokens=False)[0]
        assert texts[:2] == (letter, " " + letter)
    flat = [i for ids in lt.token_ids for i in ids]
    assert len(flat) == len(set(flat))


@pytest.mark.smollm
def test_smollm2_letter_ids_match_model_facts():
    lt = resolve_letters(get_model("smollm2-135m").tokenizer, "ABCDE")
    assert [ids[:2] for ids in lt.token_ids] == [(49, 330), (50, 389), (51, 340), (52, 422), (53, 414)]


@pytest.mark.parametrize(
    "letters,match",
    [
        (["A", "AB"], "letter 'AB': variant 'AB' is 2 tokens"),
        (["A", "A"], "repeats"),
        (["A"], "at least 2"),
        (["A", " B"], "surrounding spaces"),
    ],
)
def test_bad_letters_name_the_letter(letters, match):
    with pytest.raises(LetterTokenError, match=match):
        resolve_letters(get_model("tiny-qwen2").tokenizer, letters)


def test_newline_variant_only_when_single_token():
    tok = get_model("tiny-qwen2").tokenizer
    lt = resolve_letters(tok, "AB")
    newline_single = len(tok.encode("\nA", add_special_tokens=False)) == 1
    assert (len(lt.token_ids[0]) == 3) == newline_single
