"""The rendered prompt, parsed back: for every frame of the judgment-action study, every scenario of the
shipped gap panels and several seeded option orders, the lettered option lines of the prompt name the
options in the order asked, the order a run records (`option_ids`), with the recorded violating letter on
the violating option's line; on the tokenized chat prompt too. Panel order is never what is asked for
every order, so a renderer that lists options as written fails here.
"""

import re

import pytest

from contract.names import FRAMES, PARAPHRASE_CELLS
from engine.render import Prompt, encode_prompt
from panels.frames import honest_first_answer, render
from panels.orders import option_orders
from panels.schema import load_panel
from tests.helpers import get_model

LINE = re.compile(r"^([A-E])\) (.+)$", re.M)


def listed(text: str) -> list[tuple[str, str]]:
    """(letter, text) of each lettered option line, in the order the prompt shows them."""
    return LINE.findall(text)


def line_texts(scenario, cell: str) -> dict[str, str]:
    """Option line text -> option id, as the scenario's data says (tools: 'name: description')."""
    s = scenario.paraphrased() if cell in PARAPHRASE_CELLS else scenario
    if s.tools is not None:
        texts = {f"{t.name}: {t.description}": t.id for t in s.tools}
    else:
        texts = {o.text: o.id for o in s.options}
    assert len(texts) == len(s.options), f"{s.id}: two options read the same"
    return texts


def prompt_text(r) -> str:
    return r.text if r.text is not None else "\n\n".join(m["content"] for m in r.messages)


def parse_back(scenario, r, text: str) -> list[str]:
    """The option ids the prompt lists, in its order (and the letters must run A, B, C ...)."""
    lines = listed(text)
    texts = line_texts(scenario, r.cell)
    assert [letter for letter, _ in lines] == list("ABCDE"[: len(texts)]), (scenario.id, r.frame, lines)
    return [texts[body] for _, body in lines]


def check(scenario, frame, cell, order, text=None):
    r = render(scenario, frame, cell, order)
    s = scenario.paraphrased() if cell in PARAPHRASE_CELLS else scenario
    asked = [s.options[i].id for i in order]
    shown = parse_back(scenario, r, prompt_text(r) if text is None else text(r))
    assert shown == asked == list(r.option_ids), (scenario.id, frame, cell, order, shown)
    assert dict(zip(r.letters, shown))[r.violating_letter] == scenario.violating
    if scenario.pushback is not None and r.messages is not None and len(r.messages) == 3:
        # F2: the agent's first answer (the assistant turn) is the letter of the honest option in this order.
        assert dict(zip(r.letters, shown))[r.messages[1]["content"]] == honest_first_answer(scenario)
    return r


@pytest.mark.parametrize("panel", ["gap-v1", "gap-v2"])
def test_every_frame_lists_options_in_the_order_asked(panel):
    moved = 0
    for s in load_panel(panel).records:
        n = len(s.options)
        orders = option_orders(n, 2 * n, seed=7, key=s.id)
        assert any(list(o) != list(range(n)) for o in orders)
        for cell in s.cells:
            for frame in FRAMES:
                for order in orders:
                    check(s, frame, cell, order)
                    moved += list(order) != list(range(n))
    assert moved > 1000


@pytest.mark.parametrize("model", ["tiny-qwen2", "tiny-llama3", "tiny-base"])
def test_tokenized_prompt_lists_options_in_the_order_asked(model):
    """The same parse on the prompt the engine reads: the token ids decoded back to text."""
    tok = get_model(model).tokenizer
    chat = tok.chat_template is not None
    panel = load_panel("gap-v2")
    picked = {}
    for s in panel.records:  # two scenarios of each family, F4 with a paraphrase among them
        if len(picked.setdefault(s.family, [])) < 2 and (s.family != "F4" or s.paraphrase is not None):
            picked[s.family].append(s)
    frames = FRAMES if chat else [f for f in FRAMES if f.startswith("raw_")]
    for s in (x for group in picked.values() for x in group):
        for order in option_orders(len(s.options), 3, seed=1, key=s.id):
            for cell in s.cells:
                for frame in frames:
                    def decoded(r):
                        prompt = Prompt(text=r.text) if r.text is not None else Prompt(messages=r.messages, system=r.system)
                        return tok.decode(encode_prompt(tok, prompt))
                    check(s, frame, cell, order, text=decoded)
