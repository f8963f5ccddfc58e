"""`encode_prompts` (rendered templates tokenized in batch calls, for planning thousands of prompts) gives the
ids `encode_prompt` gives, prompt by prompt, on every template family; bad prompts fail the same way."""

import pytest

from engine.errors import RenderError
from engine.render import Prompt, encode_prompt, encode_prompts
from tests.helpers import CHAT_TINY, TINY, get_model

CHAT = [
    Prompt(messages=({"role": "user", "content": "Pick one.\nA) Report\nB) Hide\nReply with only the letter."},)),
    Prompt(messages=({"role": "user", "content": "Say hello."},), system="You are terse."),
    Prompt(messages=({"role": "user", "content": "First."}, {"role": "assistant", "content": "Yes."},
                     {"role": "user", "content": "Second, with ümlauts and emoji 🚀."})),
]
RAW = [Prompt(text="The agent chooses option"), Prompt(text="  leading spaces and\nnew lines")]


@pytest.mark.parametrize("name", TINY)
def test_batch_encoding_equals_one_at_a_time(name):
    lm = get_model(name)
    prompts = (CHAT if name in CHAT_TINY else []) + RAW
    mixed = [p for pair in zip(prompts, reversed(prompts)) for p in pair]  # interleaved kinds, order kept
    assert encode_prompts(lm.tokenizer, mixed) == [encode_prompt(lm.tokenizer, p) for p in mixed]


def test_batch_encoding_refuses_what_the_single_path_refuses():
    lm = get_model("tiny-llama3")
    with pytest.raises(RenderError, match="messages already start with one"):
        encode_prompts(lm.tokenizer, [Prompt(messages=({"role": "system", "content": "x"},), system="y")])
    with pytest.raises(RenderError, match="text is empty"):
        encode_prompts(lm.tokenizer, [Prompt(text="")])
    assert encode_prompts(lm.tokenizer, []) == []
