"""The records a panel holds, as data: a judgment–action scenario (with its options, tools and paraphrase),
a polarity dilemma, and the loaded panel; and the panel error every check raises. panels/schema.py builds
them from a panel file (validating every field), panels/review.py checks a panel's review record against them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from contract.names import CELLS, PARAPHRASE_CELLS

SLOT = "{pressure}"
"""The one slot of a scenario's context, filled by its pressure sentence or one of its twins' replacements."""


class PanelError(Exception):
    """A panel file breaks the schema; the message is one line naming the file, line and field."""


@dataclass(frozen=True)
class Option:
    """One option of a scenario."""

    id: str
    """Stable slug; letters are assigned per option order, never stored."""
    text: str
    """The action, phrased without a subject."""


@dataclass(frozen=True)
class Tool:
    """F3: the option presented as a tool the agent can call."""

    id: str
    """The option id this tool stands for."""
    name: str
    """snake_case tool name."""
    description: str
    """One sentence."""


@dataclass(frozen=True)
class Paraphrase:
    """F4: the same scenario reworded by a second writer, so a result can be checked against its wording."""

    writer: str
    """Who wrote the paraphrase; never the scenario's generator."""
    context: str
    """The reworded context, with exactly one {pressure} slot."""
    pressure: str
    """The reworded incentive sentence."""
    filler: str
    """The reworded neutral sentence (the paraphrase's pressure-removed twin)."""
    options: tuple[Option, ...]
    """The reworded options: the scenario's ids in its order, so `violating` names the same option."""


@dataclass(frozen=True)
class Scenario:
    """A judgment–action scenario: one case posed as agent and as judge, with its twins."""

    id: str
    family: str
    """F1..F5 (panels/SCHEMA.md)."""
    domain: str
    generator: str
    """Who wrote it (for the generator slice)."""
    prompt_version: str
    protagonist: str
    """The acting party's name, as the context uses it."""
    agent: str
    """A short role description of the protagonist."""
    context: str
    """Third-person situation with exactly one {pressure} slot."""
    pressure: str
    """The incentive sentence (primary cell)."""
    filler: str
    """Its pressure-removed replacement (twin cell)."""
    options: tuple[Option, ...]
    violating: str
    """Id of the option that breaks the norm."""
    norm: str
    pushback: str | None = None
    """F2: the user's second turn."""
    tools: tuple[Tool, ...] | None = None
    """F3: options as tools, same ids."""
    harm_twin_filler: str | None = None
    """F5: replacement that removes the incentive but keeps the harm level (harm_twin cell)."""
    paraphrase: Paraphrase | None = None
    """F4, optional: the scenario reworded by a second writer (render it through `paraphrased()`)."""
    metadata: tuple = ()
    """The user's own (key, value) pairs (contract.metadata), carried to every output row; never rendered."""
    source: str | None = None
    """file:line it was loaded from."""

    @property
    def cells(self) -> tuple[str, ...]:
        """The cells this scenario can be read in (contract.names.CELLS it has the text for)."""
        has = {"harm_twin": self.harm_twin_filler is not None, **{c: self.paraphrase is not None for c in PARAPHRASE_CELLS}}
        return tuple(c for c in CELLS if has.get(c, True))

    def situation(self, cell: str = "primary") -> str:
        """The context with the slot filled for `cell`."""
        sentence = {"primary": self.pressure, "twin": self.filler, "harm_twin": self.harm_twin_filler}.get(cell)
        if cell == "paraphrase":
            # The paraphrase also rewords the options, which a situation string cannot carry: filling the
            # slot here would pair the new context with the old option texts.
            raise PanelError(f"{self.id}: cell: 'paraphrase' is rendered from scenario.paraphrased() "
                             f"(its 'primary' and 'twin' cells), not from situation()")
        if sentence is None:
            raise PanelError(f"{self.id}: cell: '{cell}' is not one of this scenario's cells {self.cells}")
        return self.context.replace(SLOT, sentence)

    def option(self, option_id: str) -> Option:
        return next(o for o in self.options if o.id == option_id)

    def paraphrased(self) -> "Scenario":
        """The paraphrase as a scenario that frames render unchanged: same id, family, norm and
        violating id; context, pressure, filler and option texts replaced; `paraphrase` None. Its
        "primary" cell is the paraphrase cell (its "twin" cell the paraphrase with its filler)."""
        p = self.paraphrase
        if p is None:
            raise PanelError(f"{self.id}: paraphrase: this scenario has none (only some F4 scenarios do)")
        return dataclasses.replace(self, context=p.context, pressure=p.pressure, filler=p.filler,
                                   options=p.options, paraphrase=None)


@dataclass(frozen=True)
class Dilemma:
    """A polarity-audit dilemma (negation paper, Appendix A)."""

    id: str
    domain: str
    title: str
    description: str
    """The paper's one-line description (the spec)."""
    scenario: str
    """Scenario text shown to the model."""
    action: str
    """Action clause a: "They should {a}."."""
    goal: str
    """Goal clause g: "They should {g} even if it means they must {a}."."""
    provenance: tuple[tuple[str, str], ...] | None = None
    """Where each field's text comes from, (field, "paper: <where>" or "written here ..."), in the file's order;
    None when the panel does not say (the field is optional)."""
    metadata: tuple = ()
    """The user's own (key, value) pairs (contract.metadata), carried to every output row; never rendered."""
    source: str | None = None


@dataclass(frozen=True)
class Panel:
    """A loaded panel: its records, where it came from, and a content hash for manifests."""

    name: str
    path: str
    kind: str
    """"gap" (Scenario records) or "nsi" (Dilemma records)."""
    records: tuple
    sha256: str
    review: str | None = None
    """The review record checked with the panel (X.review.jsonl beside X.jsonl; panels/review.py), if any."""

    def get(self, record_id: str):
        for r in self.records:
            if r.id == record_id:
                return r
        raise PanelError(f"{self.path}: id: no record '{record_id}' in panel {self.name}")
