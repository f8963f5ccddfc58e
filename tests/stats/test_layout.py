"""The stats package's layout rules: names come from the table contract, one figure convention, small modules.

- No stats module declares its own collection of readout, cell, frame or framing names: a tuple, list, set
  or dict literal holding two or more of them as strings, or rows keyed by them, is flagged (single uses,
  such as `run.col("primary", "D", "p_violating")` or a Markdown header "primary", are fine). Framings are
  checked in stats/nsi and stats/core only: the gap panel's scenario families are also called F1..F5.
- No module imports pyplot (figures are drawn on an Agg canvas, `stats.core.figures`).
- No module over 400 lines, no function over 80 unless its docstring says why ("Long because").
"""

import ast
from pathlib import Path

import pytest

from contract import CELLS, DOSE_ARMS, FRAMES, FRAMINGS, JUDGE_AGGREGATE, readout_names
from tests.helpers import ROOT

STATS = ROOT / "stats"
NAMES = {"readout": set(readout_names()), "cell": set(CELLS), "frame": {*FRAMES, JUDGE_AGGREGATE},
         "dose arm": set(DOSE_ARMS), "framing": set(FRAMINGS)}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def _sources(root: Path = STATS) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _names_in(items, kinds) -> list[tuple[int, str, str]]:
    return [(item.lineno, kind, item.value) for item in items
            if isinstance(item, ast.Constant) and isinstance(item.value, str)
            for kind, names in kinds.items() if item.value in names]


def declared_names(source: str, kinds: dict[str, set[str]]) -> list[tuple[int, str, str]]:
    """(line, kind, name) for each contract name in a collection literal that declares names: one holding
    two or more distinct names (a tuple, list or set, or a dict's keys or values), or a table of rows each
    keyed by a name, like `(("dose_reasoning", 512), ("dose_brief", 64))`."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            groups = [node.elts]
            rows = [e for e in node.elts if isinstance(e, (ast.Tuple, ast.List)) and e.elts]
            if len(rows) >= 2:
                groups.append([r.elts[0] for r in rows])
        elif isinstance(node, ast.Dict):
            groups = [[k for k in node.keys if k is not None], node.values]
        else:
            continue
        for items in groups:
            found = _names_in(items, kinds)
            if len({name for _, _, name in found}) >= 2:
                hits += found
    return sorted(set(hits))


def _kinds(path: Path) -> dict[str, set[str]]:
    return {k: v for k, v in NAMES.items() if k != "framing" or path.parent.name in ("nsi", "core")}


def test_no_stats_module_declares_contract_names():
    hits = [f"{p.relative_to(ROOT)}:{line}: {kind} {name!r}"
            for p in _sources() for line, kind, name in declared_names(p.read_text(), _kinds(p))]
    assert not hits, "take these from `contract` (see stats/gap/names.py):\n" + "\n".join(hits)


@pytest.mark.parametrize("source, expect", [
    ('READOUTS = ("D", "J")', [("readout", "D"), ("readout", "J")]),
    ('PLANT = {"dose_filler": 0.1, "dose_brief": 0.2}',
     [("frame", "dose_brief"), ("frame", "dose_filler"), ("readout", "dose_brief"), ("readout", "dose_filler")]),
    ('ARMS = (("dose_reasoning", 512), ("dose_norm", 512))',
     [("frame", "dose_norm"), ("frame", "dose_reasoning"), ("readout", "dose_norm"), ("readout", "dose_reasoning")]),
    ('ARMS = ["reasoning", "filler"]', [("dose arm", "filler"), ("dose arm", "reasoning")]),
    ('for cell in ("primary", "twin"):\n    pass', [("cell", "primary"), ("cell", "twin")]),
    ('NEG = {"F1", "F3"}', [("framing", "F1"), ("framing", "F3")]),
    ('x = run.col("primary", "D", "p_violating")', []),
    ('headers = ["contrast", "primary", "twin (P1-A12)"]', []),
    ('style = {"F4": ("D", "#ff7f0e")}', []),
])
def test_the_scan_flags_declared_collections(source, expect):
    assert sorted((kind, name) for _, kind, name in declared_names(source, NAMES)) == expect


def test_no_module_imports_pyplot():
    for path in _sources():
        tree = ast.parse(path.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
                 for a in n.names}
        assert not any("pyplot" in m for m in mods), path


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(STATS)))
def test_modules_and_functions_stay_small(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{path.name}: {len(text.splitlines())} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            reason = "long because" in (ast.get_docstring(node) or "").lower()
            assert length <= MAX_FUNCTION_LINES or reason, f"{path.name}: {node.name} is {length} lines"
