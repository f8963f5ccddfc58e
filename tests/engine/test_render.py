"""Template goldens: each tiny family's rendered token ids show the family's rules.

Goldens live in tests/goldens/templates.json; regenerate with UPDATE_GOLDENS=1 after a deliberate change.
"""

import json
import os

import pytest

from engine.errors import RenderError
from engine.render import encode_chat, encode_raw
from tests.helpers import CHAT_TINY, GOLDENS, get_model

GOLDEN = GOLDENS / "templates.json"
USER = [{"role": "user", "content": "Pick A or B. Reply with only the letter."}]
TWO_TURN = [*USER, {"role": "assistant", "content": "A"}, {"role": "user", "content": "Are you sure?"}]
SYSTEM = "You are a careful operations agent."
DEFAULT_SYSTEM = {
    "tiny-olmo3": "You are a helpful function-calling AI assistant. You do not currently have access to any functions. <functions></functions>",
    "tiny-qwen2": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
}


def _cases(tok):
    return {
        "default_system": encode_chat(tok, USER),
        "given_system": encode_chat(tok, USER, system=SYSTEM),
        "two_turn": encode_chat(tok, TWO_TURN),
    }


def test_goldens():
    current = {name: _cases(get_model(name).tokenizer) for name in CHAT_TINY}
    current["tiny-base:raw"] = {"raw": encode_raw(get_model("tiny-base").tokenizer, "The assistant chooses option")}
    if os.environ.get("UPDATE_GOLDENS"):
        GOLDEN.write_text(json.dumps(current, indent=1) + "\n")
    assert current == json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", ["tiny-olmo3", "tiny-qwen2"])
def test_default_system_injected_and_replaced(name):
    tok = get_model(name).tokenizer
    plain = tok.decode(encode_chat(tok, USER))
    given = tok.decode(encode_chat(tok, USER, system=SYSTEM))
    assert plain.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM[name]}<|im_end|>\n<|im_start|>user\n")
    assert DEFAULT_SYSTEM[name] not in given
    assert given.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n")
    assert plain.endswith("<|im_start|>assistant\n")


def test_olmo3_template_adds_no_bos():
    tok = get_model("tiny-olmo3").tokenizer
    assert encode_chat(tok, USER)[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_llama3_exactly_one_bos_and_dated_system_block():
    tok = get_model("tiny-llama3").tokenizer
    for system in (None, SYSTEM):
        ids = encode_chat(tok, USER, system=system)
        assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
        text = tok.decode(ids)
        assert text.startswith(
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        )
        assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert (SYSTEM in text) == (system is not None)
    # The trap the engine avoids: rendering to text and tokenizing again doubles the BOS.
    text = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=False)
    assert tok(text)["input_ids"][:2] == [tok.bos_token_id, tok.bos_token_id]


def test_tulu3_format_and_single_bos():
    tok = get_model("tiny-tulu3").tokenizer
    ids = encode_chat(tok, USER)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
    assert tok.decode(ids) == "<|begin_of_text|><|user|>\nPick A or B. Reply with only the letter.\n<|assistant|>\n"
    assert tok.decode(encode_chat(tok, USER, system=SYSTEM)).startswith(f"<|begin_of_text|><|system|>\n{SYSTEM}\n<|user|>\n")


def test_raw_frame_follows_tokenizer_bos_rule():
    base = get_model("tiny-base").tokenizer
    ids = encode_raw(base, "The assistant chooses option")
    assert ids[0] == base.bos_token_id and ids.count(base.bos_token_id) == 1
    qwen = get_model("tiny-qwen2").tokenizer
    assert encode_raw(qwen, "The assistant chooses option") == qwen.encode("The assistant chooses option", add_special_tokens=False)


def test_render_errors():
    with pytest.raises(RenderError, match="no chat template"):
        encode_chat(get_model("tiny-base").tokenizer, USER)
    tok = get_model("tiny-qwen2").tokenizer
    with pytest.raises(RenderError, match="already start"):
        encode_chat(tok, [{"role": "system", "content": "x"}, *USER], system=SYSTEM)
    with pytest.raises(RenderError, match="messages\\[0\\]"):
        encode_chat(tok, [{"role": "user"}])
    with pytest.raises(RenderError, match="empty"):
        encode_raw(tok, "")


def test_manifest_facts(models):
    lm = models("tiny-llama3")
    assert lm.facts.bos_token_id == lm.tokenizer.bos_token_id and lm.facts.tokenizer_adds_bos
    assert len(lm.facts.chat_template_sha256) == 64
    assert models("tiny-olmo3").facts.tokenizer_adds_bos is False
    lt = lm.letters(("A", "B"))
    manifest = lt.as_manifest()
    assert [v["text"] for v in manifest["A"]][:2] == ["A", " A"]
