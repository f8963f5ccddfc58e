"""A chat-template override and template variables: the rendered ids are the ones the given template and
variables produce, and the manifest records the template's hash and the variables."""

import json

import pytest

from cli.main import main
from engine.errors import ReadoutError
from engine.loading import load_model
from engine.render import Prompt, encode_prompt, encode_prompts
from readouts.manifest import model_manifest

TEMPLATE = ("{{ greeting | default('Hello') }}|{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
PROMPT = Prompt(messages=({"role": "user", "content": "Pick A or B."},))


def test_override_and_variables_render_as_given(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    base = load_model("tiny-llama3", device="cpu")
    lm = load_model("tiny-llama3", device="cpu", chat_template=str(path))
    tok = lm.tokenizer
    expected = tok("Hello|<user>Pick A or B.\n<assistant>", add_special_tokens=False)["input_ids"]
    assert encode_prompt(tok, PROMPT) == [tok.bos_token_id, *expected]  # the template writes no BOS: the tokenizer's is added
    assert encode_prompt(tok, PROMPT) != encode_prompt(base.tokenizer, PROMPT)
    hi = load_model("tiny-llama3", device="cpu", chat_template=str(path), template_kwargs={"greeting": "Hi there"})
    ids = encode_prompt(hi.tokenizer, PROMPT)
    assert hi.tokenizer.decode(ids).endswith("Hi there|<user>Pick A or B.\n<assistant>")
    assert encode_prompts(hi.tokenizer, [PROMPT]) == [ids]
    m0, m1 = (model_manifest(x, x.letters("AB"))["template"] for x in (base, hi))
    assert m0["chat_template_sha256"] != m1["chat_template_sha256"]
    assert m1["template_kwargs"] == {"greeting": "Hi there"} and "template_kwargs" not in m0
    with pytest.raises(ReadoutError, match="--chat-template: .*no such file"):
        load_model("tiny-llama3", device="cpu", chat_template=str(tmp_path / "missing.jinja"))


def test_override_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    probes = tmp_path / "p.jsonl"
    probes.write_text(json.dumps({"id": "a", "messages": list(PROMPT.messages), "letters": ["A", "B"]}) + "\n")
    out = tmp_path / "o.jsonl"
    with pytest.raises(SystemExit) as exc:
        main(["score", str(probes), "--model", "tiny-llama3", "--out", str(out), "--chat-template", str(path),
              "--template-kwarg", "greeting=Hi there"])
    assert exc.value.code == 0
    meta = json.loads((tmp_path / "o.jsonl.manifest.json").read_text())
    assert meta["template"]["template_kwargs"] == {"greeting": "Hi there"}
    with pytest.raises(SystemExit) as exc:
        main(["score", str(probes), "--model", "tiny-llama3", "--out", str(out), "--template-kwarg", "greeting"])
    assert exc.value.code == 2 and "must look like KEY=VALUE" in capsys.readouterr().err
