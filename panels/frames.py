"""Frames: turning a scenario, a cell and an option order into chat messages or raw text.

The texts are versioned data (panels/frames/<version>.toml: v1, the default, and v2, which differs only in
the norm-naming dose arm stating the scenario's norm); this module only fills them in. Each frame has one
renderer; every rendered frame carries the letters it is read at, which option stands at each letter,
and the violating option's letter.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources

from contract.names import DOSE_FRAMES, FRAMES, FRAMINGS, JUDGE_FRAMES, NEGATED, PARAPHRASE_CELLS
from panels.records import Dilemma, PanelError, Scenario

LETTERS = "ABCDE"
DEFAULT_VERSION = "v1"


@functools.lru_cache(maxsize=None)
def frame_texts(version: str = DEFAULT_VERSION) -> dict:
    """The frame texts of one version."""
    try:
        raw = resources.files("panels").joinpath(f"frames/{version}.toml").read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PanelError(f"panels/frames/{version}.toml: version: no such frames version") from None
    return tomllib.loads(raw)


@dataclass(frozen=True)
class RenderedFrame:
    """One scenario x cell x frame x option order, ready for the engine."""

    scenario_id: str
    cell: str
    """primary | twin | harm_twin."""
    frame: str
    """One of FRAMES."""
    order: tuple[int, ...]
    """Indices into scenario.options, in letter order."""
    letters: tuple[str, ...]
    option_ids: tuple[str, ...]
    """The option id standing at each letter."""
    violating_letter: str
    messages: tuple[dict, ...] | None
    """Chat messages (chat frames); None for raw frames."""
    text: str | None
    """Raw-frame text ending right before the letter; None for chat frames."""
    system: str | None
    """System prompt that replaces the template's default one (control frame), else None."""
    anchor: str | None
    """For frames read after the model writes (judge paraphrases, dose arms): the text the letter follows."""
    version: str
    """Frames version, e.g. frames-v1."""

    def letter_of(self, option_id: str) -> str:
        return self.letters[self.option_ids.index(option_id)]


def _options_block(scenario: Scenario, order, texts: dict) -> str:
    lines = []
    for letter, idx in zip(LETTERS, order):
        option = scenario.options[idx]
        if scenario.tools is not None:
            tool = scenario.tools[idx]
            lines.append(texts["tool_line"].format(letter=letter, name=tool.name, description=tool.description))
        else:
            lines.append(texts["option_line"].format(letter=letter, text=option.text))
    return "\n".join(lines)


def _check_order(scenario: Scenario, order) -> tuple[int, ...]:
    order = tuple(order) if order is not None else tuple(range(len(scenario.options)))
    if sorted(order) != list(range(len(scenario.options))):
        raise PanelError(f"{scenario.id}: order: {order} is not a permutation of {len(scenario.options)} options")
    if len(order) > len(LETTERS):
        raise PanelError(f"{scenario.id}: options: more than {len(LETTERS)} options cannot be lettered")
    return order


def honest_first_answer(scenario: Scenario) -> str:
    """F2: the option the agent's first, honest answer stands for (the first non-violating option listed)."""
    return next(o.id for o in scenario.options if o.id != scenario.violating)


def render(scenario: Scenario, frame: str, cell: str = "primary", order=None, version: str = DEFAULT_VERSION) -> RenderedFrame:
    """Render `frame` for `scenario` in `cell` with options in `order` (default: as listed)."""
    if frame not in FRAMES:
        raise PanelError(f"{scenario.id}: frame: '{frame}' is not one of {', '.join(FRAMES)}")
    texts = frame_texts(version)
    read_cell = cell
    if cell in PARAPHRASE_CELLS:  # the paraphrase rewords the options too: render it as a scenario of its own
        if scenario.paraphrase is None:
            raise PanelError(f"{scenario.id}: cell: '{cell}' needs a paraphrase, and this scenario has none")
        scenario, cell = scenario.paraphrased(), PARAPHRASE_CELLS[cell]
    order = _check_order(scenario, order)
    letters = tuple(LETTERS[: len(order)])
    option_ids = tuple(scenario.options[i].id for i in order)
    situation = scenario.situation(cell)
    fields = dict(
        protagonist=scenario.protagonist, agent=scenario.agent, options=_options_block(scenario, order, texts),
        violating_text=scenario.option(scenario.violating).text, pushback=scenario.pushback or "", norm=scenario.norm,
    )
    messages = text = system = anchor = None
    agent_key = "tools_user" if scenario.tools is not None else "user"

    def agent_turns(last_line: str | None = None):
        first = texts["agent"][agent_key].format(situation=situation, **fields)
        if scenario.pushback is None:
            if last_line is not None:
                first = first.rsplit("\n\n", 1)[0] + "\n\n" + last_line
            return ({"role": "user", "content": first},)
        honest = letters[option_ids.index(honest_first_answer(scenario))]
        second = texts["agent"]["pushback_user"].format(**fields)
        if last_line is not None:
            second = second.rsplit("\n\n", 1)[0] + "\n\n" + last_line
        return ({"role": "user", "content": first}, {"role": "assistant", "content": honest}, {"role": "user", "content": second})

    judged = situation
    if scenario.pushback is not None:
        judged = texts["judge"]["pushback_situation"].format(situation=situation, pushback=scenario.pushback)
    if frame == "agent":
        messages = agent_turns()
    elif frame == "control":
        messages = agent_turns()
        system = texts["control"]["system"].format(**fields)
    elif frame in DOSE_FRAMES:  # v1's dose texts hold no placeholder; v2's norm arm holds {norm}
        messages = agent_turns(texts["dose"][frame.removeprefix("dose_")].format(**fields))
        anchor = texts["dose"]["anchor"]
    elif frame in JUDGE_FRAMES:
        template = texts["judge"]["paraphrases"][JUDGE_FRAMES.index(frame)]
        messages = ({"role": "user", "content": template.format(situation=judged, **fields)},)
        anchor = texts["judge"]["anchor"]
    elif frame == "judge_letter":
        messages = ({"role": "user", "content": texts["judge"]["letter_only"].format(situation=judged, **fields)},)
    else:
        text = texts["raw"][frame.removeprefix("raw_")].format(situation=judged, **fields)
    return RenderedFrame(
        scenario_id=scenario.id, cell=read_cell, frame=frame, order=order, letters=letters, option_ids=option_ids,
        violating_letter=letters[option_ids.index(scenario.violating)], messages=messages, text=text,
        system=system, anchor=anchor, version=texts["version"],
    )


@dataclass(frozen=True)
class PolarityPrompt:
    """A negation-audit framing of one dilemma, wrapped in the JSON response-schema prompt."""

    dilemma_id: str
    framing: str
    """F0..F3."""
    negated: bool
    """Whether the framing negates (F1, F3): endorsement a = decision XOR negated."""
    proposal: str
    messages: tuple[dict, ...]
    version: str


def proposal(dilemma: Dilemma, framing: str, version: str = DEFAULT_VERSION) -> str:
    texts = frame_texts(version)["polarity"]
    if framing not in FRAMINGS:
        raise PanelError(f"{dilemma.id}: framing: '{framing}' is not one of {', '.join(FRAMINGS)}")
    return texts[framing].format(a=dilemma.action, g=dilemma.goal)


def render_polarity(dilemma: Dilemma, framing: str, version: str = DEFAULT_VERSION) -> PolarityPrompt:
    """The JSON-schema prompt of the negation paper (Appendix C.2) for one framing; no system prompt."""
    texts = frame_texts(version)
    sentence = proposal(dilemma, framing, version)
    content = texts["polarity"]["prompt"].format(scenario_text=dilemma.scenario, proposal_text=sentence)
    return PolarityPrompt(
        dilemma_id=dilemma.id, framing=framing, negated=NEGATED[framing], proposal=sentence,
        messages=({"role": "user", "content": content},), version=texts["version"],
    )
