"""Scenario schema and loading: strict JSONL with errors of the form `file:line: field: what is wrong`.

Two kinds of panel share the loader: judgment–action panels (gap-v1; fields in panels/SCHEMA.md) and
polarity dilemma panels (nsi-14; id, domain, title, description, scenario, action, goal).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

FAMILIES = ("F1", "F2", "F3", "F4", "F5")
CELLS = ("primary", "twin", "harm_twin")
SLOT = "{pressure}"
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_BRACE_SLOT = re.compile(r"\{[^{}]*\}")


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
    source: str | None = None
    """file:line it was loaded from."""

    @property
    def cells(self) -> tuple[str, ...]:
        return ("primary", "twin", "harm_twin") if self.harm_twin_filler else ("primary", "twin")

    def situation(self, cell: str = "primary") -> str:
        """The context with the slot filled for `cell`."""
        sentence = {"primary": self.pressure, "twin": self.filler, "harm_twin": self.harm_twin_filler}.get(cell)
        if sentence is None:
            raise PanelError(f"{self.id}: cell: '{cell}' is not one of this scenario's cells {self.cells}")
        return self.context.replace(SLOT, sentence)

    def option(self, option_id: str) -> Option:
        return next(o for o in self.options if o.id == option_id)


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

    def get(self, record_id: str):
        for r in self.records:
            if r.id == record_id:
                return r
        raise PanelError(f"{self.path}: id: no record '{record_id}' in panel {self.name}")


GAP_REQUIRED = ("id", "family", "domain", "generator", "prompt_version", "protagonist", "agent", "context",
                "pressure", "filler", "options", "violating", "norm")
GAP_OPTIONAL = ("pushback", "tools", "harm_twin")
NSI_FIELDS = ("id", "domain", "title", "description", "scenario", "action", "goal")


def shipped_panels() -> dict[str, Path]:
    """Panels shipped in panels/data, by name (file stem)."""
    root = Path(str(resources.files("panels").joinpath("data")))
    return {p.stem: p for p in sorted(root.glob("*.jsonl"))}


def resolve_panel(name_or_path: str) -> Path:
    shipped = shipped_panels()
    if name_or_path in shipped:
        return shipped[name_or_path]
    path = Path(name_or_path)
    if path.is_file():
        return path
    raise PanelError(f"{name_or_path}: panel: not a shipped panel ({', '.join(shipped) or 'none'}) nor a file")


def _fail(where: str, field: str, problem: str):
    raise PanelError(f"{where}: {field}: {problem}")


def _text(obj: dict, key: str, where: str) -> str:
    value = obj[key]
    if not isinstance(value, str):
        _fail(where, key, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        _fail(where, key, "is empty")
    return value


def _gap_record(obj: dict, where: str) -> Scenario:
    unknown = sorted(set(obj) - set(GAP_REQUIRED) - set(GAP_OPTIONAL))
    if unknown:
        _fail(where, unknown[0], "unknown field")
    for key in GAP_REQUIRED:
        if key not in obj:
            _fail(where, key, "missing")
    strings = {k: _text(obj, k, where) for k in GAP_REQUIRED if k != "options"}
    if not _ID.match(strings["id"]):
        _fail(where, "id", f"'{strings['id']}' must be lowercase letters, digits, '.', '_' or '-'")
    family = strings["family"]
    if family not in FAMILIES:
        _fail(where, "family", f"'{family}' is not one of {', '.join(FAMILIES)}")
    context = strings["context"]
    slots = _BRACE_SLOT.findall(context)
    if slots.count(SLOT) != 1:
        _fail(where, "context", f"must contain exactly one {SLOT} slot, found {slots.count(SLOT)}")
    others = [s for s in slots if s != SLOT]
    if others:
        _fail(where, "context", f"unknown slot {others[0]} (only {SLOT} is allowed)")
    for key in ("pressure", "filler"):
        if "{" in strings[key] or "}" in strings[key]:
            _fail(where, key, "must not contain braces")
    raw_options = obj["options"]
    if not isinstance(raw_options, list):
        _fail(where, "options", "must be a list")
    if not 2 <= len(raw_options) <= 5:
        _fail(where, "options", f"needs 2 to 5 options, got {len(raw_options)}")
    options = []
    for i, o in enumerate(raw_options):
        if not isinstance(o, dict) or set(o) != {"id", "text"}:
            _fail(where, f"options[{i}]", "must be an object with exactly 'id' and 'text'")
        oid, otext = _text(o, "id", f"{where}: options[{i}]"), _text(o, "text", f"{where}: options[{i}]")
        options.append(Option(oid, otext))
    ids = [o.id for o in options]
    if len(set(ids)) != len(ids):
        _fail(where, "options", f"option ids repeat: {ids}")
    if strings["violating"] not in ids:
        _fail(where, "violating", f"'{strings['violating']}' is not among the option ids {ids}")
    pushback = tools = harm = None
    if "pushback" in obj:
        if family != "F2":
            _fail(where, "pushback", f"only F2 scenarios have a pushback turn (this is {family})")
        pushback = _text(obj, "pushback", where)
    elif family == "F2":
        _fail(where, "pushback", "missing (F2 scenarios need the fixed pushback turn)")
    if "tools" in obj:
        if family != "F3":
            _fail(where, "tools", f"only F3 scenarios present options as tools (this is {family})")
        raw_tools = obj["tools"]
        if not isinstance(raw_tools, list) or not raw_tools:
            _fail(where, "tools", "must be a non-empty list")
        tools = []
        for i, t in enumerate(raw_tools):
            if not isinstance(t, dict) or set(t) != {"id", "name", "description"}:
                _fail(where, f"tools[{i}]", "must be an object with exactly 'id', 'name' and 'description'")
            tw = f"{where}: tools[{i}]"
            tools.append(Tool(_text(t, "id", tw), _text(t, "name", tw), _text(t, "description", tw)))
        if [t.id for t in tools] != ids:
            _fail(where, "tools", f"tool ids {[t.id for t in tools]} must equal the option ids {ids}, in order")
        if len({t.name for t in tools}) != len(tools):
            _fail(where, "tools", "tool names repeat")
        tools = tuple(tools)
    elif family == "F3":
        _fail(where, "tools", "missing (F3 scenarios present their options as tools)")
    if "harm_twin" in obj:
        ht = obj["harm_twin"]
        if family != "F5":
            _fail(where, "harm_twin", f"only F5 scenarios have a harm-matched twin (this is {family})")
        if not isinstance(ht, dict) or set(ht) != {"filler"}:
            _fail(where, "harm_twin", "must be an object with exactly 'filler'")
        harm = _text(ht, "filler", f"{where}: harm_twin")
    return Scenario(
        id=strings["id"], family=family, domain=strings["domain"], generator=strings["generator"],
        prompt_version=strings["prompt_version"], protagonist=strings["protagonist"], agent=strings["agent"],
        context=context, pressure=strings["pressure"], filler=strings["filler"], options=tuple(options),
        violating=strings["violating"], norm=strings["norm"], pushback=pushback, tools=tools,
        harm_twin_filler=harm, source=where,
    )


def _nsi_record(obj: dict, where: str) -> Dilemma:
    unknown = sorted(set(obj) - set(NSI_FIELDS))
    if unknown:
        _fail(where, unknown[0], "unknown field")
    for key in NSI_FIELDS:
        if key not in obj:
            _fail(where, key, "missing")
    values = {k: _text(obj, k, where) for k in NSI_FIELDS}
    for key in ("action", "goal"):
        if values[key].rstrip().endswith("."):
            _fail(where, key, "must not end with a period (it is completed inside a framing sentence)")
    return Dilemma(**values, source=where)


def load_panel(name_or_path: str) -> Panel:
    """Load and validate a panel (shipped name or path); PanelError on the first problem."""
    path = resolve_panel(name_or_path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PanelError(f"{path}: file: cannot read ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PanelError(f"{path}: file: not UTF-8") from None
    records, seen, kind = [], {}, None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PanelError(f"{where}: json: invalid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            _fail(where, "json", "each line must be a JSON object")
        this_kind = "nsi" if "action" in obj and "goal" in obj else "gap"
        if kind is None:
            kind = this_kind
        elif this_kind != kind:
            _fail(where, "kind", f"mixes a {this_kind} record into a {kind} panel")
        record = _nsi_record(obj, where) if kind == "nsi" else _gap_record(obj, where)
        if record.id in seen:
            _fail(where, "id", f"'{record.id}' duplicates line {seen[record.id]}")
        seen[record.id] = n
        records.append(record)
    if not records:
        raise PanelError(f"{path}: file: the panel has no records")
    return Panel(name=path.stem, path=str(path), kind=kind, records=tuple(records), sha256=hashlib.sha256(data).hexdigest())
