"""Scenario schema and loading: strict JSONL with errors of the form `file:line: field: what is wrong`.

Two kinds of panel share the loader: judgment–action panels (gap-v1; fields in panels/SCHEMA.md) and
polarity dilemma panels (nsi-14; id, domain, title, description, scenario, action, goal, and an optional
provenance object saying which of them are the paper's words). The records it builds are panels/records.py's;
a judgment–action panel's review record is checked by panels/review.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from importlib import resources
from pathlib import Path

from contract.metadata import METADATA, check_metadata
from panels.jsonl import jsonl_objects, read_bytes
from panels.records import SLOT, Dilemma, Option, Panel, PanelError, Paraphrase, Scenario, Tool
from panels.review import check_panel_review

FAMILIES = ("F1", "F2", "F3", "F4", "F5")
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_BRACE_SLOT = re.compile(r"\{[^{}]*\}")


GAP_REQUIRED = ("id", "family", "domain", "generator", "prompt_version", "protagonist", "agent", "context",
                "pressure", "filler", "options", "violating", "norm")
GAP_OPTIONAL = ("pushback", "tools", "harm_twin", "paraphrase")  # contract: panel fields (a cell is read from each)
# METADATA (contract.metadata) is optional on every record, gap or nsi: the user's own fields, never rendered.
PARAPHRASE_FIELDS = ("writer", "context", "pressure", "filler", "options")
NSI_FIELDS = ("id", "domain", "title", "description", "scenario", "action", "goal")
NSI_PROVENANCE = "provenance"
"""The optional nsi field recording, per field of NSI_FIELDS, whether its text is the paper's (and where) or
was written for this project."""
PROVENANCE_FORMS = ("paper: ", "written here")


def shipped_panels() -> dict[str, Path]:
    """Panels shipped in panels/data, by name (file stem)."""
    root = Path(str(resources.files("panels").joinpath("data")))
    # X.review.jsonl is the review record of panel X (panels/review.py), not a panel.
    return {p.stem: p for p in sorted(root.glob("*.jsonl")) if not p.name.endswith(".review.jsonl")}


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


def _text(obj: dict, key: str, where: str, field: str | None = None) -> str:
    value, field = obj[key], field or key
    if not isinstance(value, str):
        _fail(where, field, f"must be a string, got {type(value).__name__}")
    if not value.strip():
        _fail(where, field, "is empty")
    return value


def _slot_text(text: str, where: str, field: str) -> str:
    slots = _BRACE_SLOT.findall(text)
    if slots.count(SLOT) != 1:
        _fail(where, field, f"must contain exactly one {SLOT} slot, found {slots.count(SLOT)}")
    others = [s for s in slots if s != SLOT]
    if others:
        _fail(where, field, f"unknown slot {others[0]} (only {SLOT} is allowed)")
    return text


def _options(raw_options, where: str, field: str) -> tuple[Option, ...]:
    if not isinstance(raw_options, list):
        _fail(where, field, "must be a list")
    options = []
    for i, o in enumerate(raw_options):
        if not isinstance(o, dict) or set(o) != {"id", "text"}:
            _fail(where, f"{field}[{i}]", "must be an object with exactly 'id' and 'text'")
        oid, otext = _text(o, "id", f"{where}: {field}[{i}]"), _text(o, "text", f"{where}: {field}[{i}]")
        options.append(Option(oid, otext))
    return tuple(options)


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def _paraphrase(obj: dict, where: str, generator: str, options: tuple[Option, ...]) -> Paraphrase:
    p = obj["paraphrase"]
    if not isinstance(p, dict):
        _fail(where, "paraphrase", f"must be an object with {', '.join(PARAPHRASE_FIELDS)}")
    for key in sorted(set(p) - set(PARAPHRASE_FIELDS)):
        _fail(where, f"paraphrase.{key}", "unknown field")
    for key in (k for k in PARAPHRASE_FIELDS if k not in p):
        _fail(where, f"paraphrase.{key}", "missing")
    texts = {k: _text(p, k, where, f"paraphrase.{k}") for k in PARAPHRASE_FIELDS if k != "options"}
    if texts["writer"].strip() == generator.strip():
        _fail(where, "paraphrase.writer", f"must differ from generator '{generator}' (a paraphrase is a second writer's wording)")
    context = _slot_text(texts["context"], where, "paraphrase.context")
    for key in (k for k in ("pressure", "filler") if "{" in texts[k] or "}" in texts[k]):
        _fail(where, f"paraphrase.{key}", "must not contain braces")
    para_options = _options(p["options"], where, "paraphrase.options")
    ids, para_ids = [o.id for o in options], [o.id for o in para_options]
    if para_ids != ids:
        # Same ids in the same order: the violating id and the option orders carry over unchanged.
        _fail(where, "paraphrase.options", f"ids {para_ids} must equal the scenario's option ids {ids}, in order")
    return Paraphrase(writer=texts["writer"], context=context, pressure=texts["pressure"], filler=texts["filler"],
                      options=para_options)


def _gap_record(obj: dict, where: str) -> Scenario:
    unknown = sorted(set(obj) - set(GAP_REQUIRED) - set(GAP_OPTIONAL) - {METADATA})
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
    context = _slot_text(strings["context"], where, "context")
    for key in ("pressure", "filler"):
        if "{" in strings[key] or "}" in strings[key]:
            _fail(where, key, "must not contain braces")
    raw_options = obj["options"]
    if not isinstance(raw_options, list):
        _fail(where, "options", "must be a list")
    if not 2 <= len(raw_options) <= 5:
        _fail(where, "options", f"needs 2 to 5 options, got {len(raw_options)}")
    options = _options(raw_options, where, "options")
    ids = [o.id for o in options]
    if len(set(ids)) != len(ids):
        _fail(where, "options", f"option ids repeat: {ids}")
    if strings["violating"] not in ids:
        _fail(where, "violating", f"'{strings['violating']}' is not among the option ids {ids}")
    pushback = tools = harm = paraphrase = None
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
        harm = _text(ht, "filler", where, "harm_twin.filler")
        # The harm twin must change the slot (F5 rule in panels/SCHEMA.md): equal to the pressure it
        # keeps the incentive, equal to the filler it drops the harm, and either way the cell is no twin.
        if _same(harm, strings["pressure"]):
            _fail(where, "harm_twin.filler", "must differ from the pressure sentence (it removes the incentive)")
        if _same(harm, strings["filler"]):
            _fail(where, "harm_twin.filler", "must differ from the filler (it restates the harm, the filler is neutral)")
    elif family == "F5":
        _fail(where, "harm_twin", "missing (every F5 scenario needs its harm-matched twin)")
    if "paraphrase" in obj:
        if family != "F4":
            _fail(where, "paraphrase", f"only F4 scenarios have a paraphrase (this is {family})")
        paraphrase = _paraphrase(obj, where, strings["generator"], tuple(options))
    return Scenario(
        id=strings["id"], family=family, domain=strings["domain"], generator=strings["generator"],
        prompt_version=strings["prompt_version"], protagonist=strings["protagonist"], agent=strings["agent"],
        context=context, pressure=strings["pressure"], filler=strings["filler"], options=tuple(options),
        violating=strings["violating"], norm=strings["norm"], pushback=pushback, tools=tools,
        harm_twin_filler=harm, paraphrase=paraphrase, metadata=_metadata(obj, where), source=where,
    )


def _provenance(raw, where: str) -> tuple[tuple[str, str], ...]:
    """The `provenance` object: keys among NSI_FIELDS, each value "paper: <where>" or "written here ..."."""
    if not isinstance(raw, dict) or not raw:
        _fail(where, NSI_PROVENANCE, "must be a non-empty object mapping panel fields to where their text comes from")
    out = []
    for key in raw:
        field = f"{NSI_PROVENANCE}.{key}"
        if key not in NSI_FIELDS:
            _fail(where, field, f"unknown field (provenance names one of {', '.join(NSI_FIELDS)})")
        text = _text(raw, key, where, field).strip()
        if not (text == "written here" or text.startswith("written here ")
                or (text.startswith("paper: ") and text[len("paper: "):].strip())):
            _fail(where, field, f"{text!r} must read 'paper: <where in the paper>' or 'written here ...'")
        out.append((key, text))
    return tuple(out)


def _nsi_record(obj: dict, where: str) -> Dilemma:
    unknown = sorted(set(obj) - set(NSI_FIELDS) - {NSI_PROVENANCE, METADATA})
    if unknown:
        _fail(where, unknown[0], "unknown field")
    for key in NSI_FIELDS:
        if key not in obj:
            _fail(where, key, "missing")
    values = {k: _text(obj, k, where) for k in NSI_FIELDS}
    for key in ("action", "goal"):
        if values[key].rstrip().endswith("."):
            _fail(where, key, "must not end with a period (it is completed inside a framing sentence)")
    provenance = _provenance(obj[NSI_PROVENANCE], where) if NSI_PROVENANCE in obj else None
    return Dilemma(**values, provenance=provenance, metadata=_metadata(obj, where), source=where)


def _metadata(obj: dict, where: str) -> tuple:
    """The record's optional metadata object, checked (contract.metadata)."""
    return check_metadata(obj[METADATA], lambda field, problem: _fail(where, field, problem)) if METADATA in obj else ()


def load_panel(name_or_path: str, review: bool = True) -> Panel:
    """Load and validate a panel (shipped name or path); PanelError on the first problem.

    With `review` (the default) a judgment-action panel's review record is checked too: the sibling
    X.review.jsonl when it exists, and it must exist for the panels in panels.review.REVIEW_REQUIRED.
    `review=False` loads the scenarios alone (to read a panel while its review is being written).
    """
    path = resolve_panel(name_or_path)
    data = read_bytes(path, PanelError)
    records, seen, kind = [], {}, None
    for where, obj in jsonl_objects(path, PanelError, data):
        n = int(where.rsplit(":", 1)[1])
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
    panel = Panel(name=path.stem, path=str(path), kind=kind, records=tuple(records), sha256=hashlib.sha256(data).hexdigest())
    if review and kind == "gap":
        checked = check_panel_review(panel)
        if checked is not None:
            panel = dataclasses.replace(panel, review=str(checked))
    return panel
