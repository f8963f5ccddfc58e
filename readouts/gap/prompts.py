"""How a rendered frame (panels/frames.py) is put to a model: as a prompt for the local engine, as the messages of
a request to a served model, and which answers after its anchor are read as its letters.
"""

from __future__ import annotations

from engine.render import Prompt


def prompt_of(rendered) -> Prompt:
    if rendered.text is not None:
        return Prompt(text=rendered.text)
    return Prompt(messages=rendered.messages, system=rendered.system)


def messages_of(rendered) -> list[dict]:
    """A rendered chat frame as request messages (its system prompt, when it sets one, first)."""
    msgs = [dict(m) for m in rendered.messages]
    if rendered.system is not None:
        msgs = [{"role": "system", "content": rendered.system}] + msgs
    return msgs


def answer_forms(scenario, rendered) -> dict:
    """What may stand after the anchor: the rendered letters and, for F3's lettered tools, each tool's
    name mapped to its letter (pre-registration A2: a tool-name answer is accepted)."""
    names = None
    if getattr(scenario, "tools", None):
        letter_of = dict(zip(rendered.option_ids, rendered.letters))
        names = {t.name: letter_of[t.id] for t in scenario.tools if t.id in letter_of}
    return {"letters": "".join(rendered.letters), "names": names}
