"""The contract is the only place names are declared: a scan of every package for collections that
re-declare cells, readouts, frames, framings or run-table columns, and a check that the tables a real run
writes are exactly the declared ones."""

import ast

import pandas as pd
import pytest

from contract import CELLS, FRAMES, FRAMINGS, JUDGE_AGGREGATE, TABLES, readout_groups, readout_names
from contract.tables import DTYPES
from readouts.driver import ModelOptions, RunOptions, run
from readouts.gap.study import GapStudy
from readouts.nsi.study import NsiStudy
from readouts.steer.study import SteerSettings, SteerStudy
from tests.helpers import ROOT

NAMES = set(CELLS) | set(FRAMES) | set(readout_names()) | set(readout_groups()) | {JUDGE_AGGREGATE}
COLUMNS = {c for t in TABLES.values() for c in t.names}
PACKAGES = ("engine", "panels", "readouts", "stats")
ALLOW = "# contract:"
"""A line carrying this comment declares something else that happens to share the names (say why after it)."""


def redeclarations(source: str, columns: bool = True) -> list[tuple[int, list[str]]]:
    """Module- and class-level assignments of collection literals holding two or more contract names
    (framings count when F0 is among them: F1..F3 alone are also family names), or five or more run-table
    columns. Uses inside functions (`for r in ("D", "J")`) are not declarations and are not scanned."""
    lines = source.splitlines()
    found = []

    def scan(body):
        for stmt in body:
            if isinstance(stmt, ast.ClassDef):
                scan(stmt.body)
                continue
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
                continue
            if ALLOW in lines[stmt.lineno - 1]:
                continue
            for node in ast.walk(stmt.value):
                if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                    items = node.elts
                elif isinstance(node, ast.Dict):
                    items = [k for k in node.keys if k is not None]
                else:
                    continue
                strings = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
                names = strings & (NAMES | (set(FRAMINGS) if "F0" in strings else set()))
                cols = strings & COLUMNS if columns else set()
                if len(names) >= 2 or len(cols) >= 5:
                    found.append((stmt.lineno, sorted(names | cols)))
                    break

    scan(ast.parse(source).body)
    return found


def test_no_package_redeclares_a_contract_name():
    offenders = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            # Panel fields share names with the table columns they end up in; only writers and readers of
            # run tables (readouts, stats) are held to the column rule.
            for line, names in redeclarations(path.read_text(encoding="utf-8"), columns=package in ("readouts", "stats")):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {names}")
    assert not offenders, "declare these in contract/ and import them:\n" + "\n".join(offenders)


def test_the_scan_catches_a_redeclaration():
    assert redeclarations('CELLS = ("primary", "twin")\n')
    assert redeclarations('X = {"D": 1, "J0": 2}\n')
    assert redeclarations('class A:\n    FRAMINGS = ("F0", "F1")\n')
    assert redeclarations('COLS = ["scenario_id", "cell", "readout", "frame", "p_violating"]\n')
    assert not redeclarations('def f(run):\n    for r in ("D", "J"):\n        run.col("primary", r)\n')
    assert not redeclarations('FAMILIES = ("F1", "F2", "F3", "F4", "F5")\nkeys = ["scenario_id", "cell"]\n')
    assert not redeclarations('X = ("D", "J")  # contract: not readouts, say why\n')


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A gap run and an NSI run on tiny models, through the driver."""
    out = tmp_path_factory.mktemp("contract")
    gap = run(GapStudy(), RunOptions(model=ModelOptions("tiny-olmo3"), limit=2, out=str(out / "gap"), progress=False,
                                     overrides=("j_samples=1", "j_budget=4", "dose_budget=4", "dose_brief_budget=2")),
              log=lambda _: None)
    nsi = run(NsiStudy(), RunOptions(model=ModelOptions("tiny-qwen2"), limit=2, out=str(out / "nsi"), progress=False,
                                     overrides=("samples=1", "budget=6")), log=lambda _: None)
    depth = run(GapStudy(readouts="D,depth"), RunOptions(model=ModelOptions("tiny-qwen2"), limit=2, out=str(out / "depth"),
                                                        progress=False, overrides=("orders.D=1", "patch_stride=2", "grid_stride=2")),
                log=lambda _: None)
    steer = run(SteerStudy(settings=SteerSettings(layers=(1,), strengths=(1.0,), random=1)),
                RunOptions(model=ModelOptions("tiny-qwen2"), panel="gap-v1", limit=4, out=str(out / "steer"), progress=False,
                           overrides=("orders.D=1", "orders.J0=1", "orders.control=1", "chunk_size=1")), log=lambda _: None)
    return {"probes": gap, "scenarios": gap, "nsi_replies": nsi, "nsi_continuous": nsi, "depth": depth, "patching": depth, "patch_grid": depth,
            "steering": steer, "steer_capability": steer}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_written_tables_hold_exactly_the_declared_columns_and_dtypes(written, name):
    table = TABLES[name]
    df = pd.read_parquet(written[name] / table.file)
    table.check(df, str(written[name] / table.file))
    assert list(df.columns) == list(table.names)
    for column in table.columns:
        if column.dtype in ("int", "float", "bool", "int?", "float?", "bool?"):
            assert str(df[column.name].dtype) == DTYPES[column.dtype], (name, column.name, df[column.name].dtype)


def test_docs_describe_every_column():
    text = (ROOT / "docs" / "tables.md").read_text(encoding="utf-8")
    missing = sorted(c for c in COLUMNS if f"`{c}`" not in text)
    assert not missing, missing
