"""Windows of chunks (readouts/chunks.py): chunks decoded together give every chunk the rows it gets alone.

The reference is the same run one chunk at a time (`--window 1`, the path every other run test checks against
plain forwards): with a window the generation batches gather several chunks' prompts, and the tables, written
chunk by chunk, are the same texts and the same numbers within the float rounding of differently shaped batches.
"""

import dataclasses
import json

import pandas as pd
import pytest
from click.testing import CliRunner

import engine.batching as batching
from cli.main import cli
from engine.errors import ReadoutError
from readouts.chunks import WINDOW_DEFAULT, window_for, windows
from readouts.driver import Interrupted, ModelOptions, RunOptions, plan_run, run
from readouts.gap import profile as gap_profile
from readouts.gap.recipe import GapRunner
from readouts.gap.served import ServedGapRunner
from readouts.gap.study import GapStudy
from readouts.nsi import profile as nsi_profile
from readouts.nsi.profile import NsiProfile
from readouts.nsi.recipe import NsiRunner
from readouts.nsi.study import NsiStudy
from readouts.steer.study import SteerRunner, SteerSettings, SteerStudy

PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="window-test", max_units=4, chunk_size=1,
                              orders={"D": 2, "J0": 2, "control": 1, "raw": 1}, j_samples=2, j_budget=6,
                              dose_samples=1, dose_budget=5, dose_brief_budget=3, rider_rollouts=2, rider_budget=7)
DEPTH_KEY = ["scenario_id", "cell", "order_index"]
DEPTH = dataclasses.replace(PROFILE, name="window-depth", chunk_size=2, patch_orders=1)


@pytest.fixture(autouse=True)
def profiles(monkeypatch):
    for p in (PROFILE, DEPTH):
        monkeypatch.setitem(gap_profile.PROFILES, p.name, p)
    monkeypatch.setitem(nsi_profile.PROFILES, "quick", NsiProfile(name="quick", chunk_size=1, samples=2, budget=8))
    # Few rows per decoding batch, so a window's batches differ from its chunks' batches.
    monkeypatch.setitem(batching.DEFAULT_BOUNDS, "generate", {**batching.DEFAULT_BOUNDS["generate"], "cpu": (16384, 40)})


def gap(tmp_path, name, window, study=None, **kw):
    options = RunOptions(model=ModelOptions("tiny-olmo3"), profile=kw.pop("profile", PROFILE.name),
                         out=str(tmp_path / name), progress=False, window=window, **kw)
    logs = []
    path = run(study or GapStudy(), options, log=logs.append)
    return path, logs


def table(path, name, key):
    return pd.read_parquet(path / f"{name}.parquet").sort_values(key).reset_index(drop=True)


def assert_same_tables(a, b, tables):
    for name, key in tables:
        x, y = table(a, name, key), table(b, name, key)
        for col in ("generated_text", "text"):
            if col in x:
                pd.testing.assert_series_equal(x[col], y[col])
        pd.testing.assert_frame_equal(x, y, check_exact=False, rtol=1e-4, atol=1e-6)


def assert_chunks_hold_their_records(path, columns, size):
    """Each chunk file holds the rows of its own records, all of them, and no other's."""
    records = json.loads((path / "manifest.json").read_text())["panel"]["records_read"]
    for i in range(0, len(records), size):
        for name, column in columns.items():
            got = set(pd.read_parquet(path / "chunks" / f"{name}-{i // size:05d}.parquet")[column])
            assert got == set(records[i : i + size]), (name, i // size)


def test_a_window_gives_each_chunk_its_own_rows(tmp_path):
    alone, _ = gap(tmp_path, "alone", 1)
    together, logs = gap(tmp_path, "together", 3)  # chunks 1-3 together, then chunk 4 alone
    assert_same_tables(alone, together, [("probes", "probe_id"), ("scenarios", "scenario_id")])
    probes = table(together, "probes", "probe_id")
    assert probes.generated_text.notna().sum() > 20 and (probes.rollout > 0).any()
    assert sum("window of 3 chunks" in line for line in logs) == 3
    # Each chunk file holds its own scenario's rows only, in the run's chunk order.
    assert_chunks_hold_their_records(together, {"probes": "scenario_id", "scenarios": "scenario_id"}, PROFILE.chunk_size)
    # The decoding batches gather the window's chunks: fewer and larger than one chunk's, and the ones the plan
    # forms over the same windows under the run's bounds.
    m1 = json.loads((alone / "manifest.json").read_text())
    m3 = json.loads((together / "manifest.json").read_text())
    assert m1["last_session"]["window"] == 1 and m3["last_session"]["window"] == 3
    for stage in ("J", "dose"):
        b1, b3 = m1["last_session"]["decode_batches_by_stage"][stage], m3["last_session"]["decode_batches_by_stage"][stage]
        assert b3 == m3["workload_by_stage"][stage]["decode_batches"], stage
        assert len(b3) < len(b1) and max(r for _, r, _, _ in b3) > max(r for _, r, _, _ in b1), stage
        assert sum(r for _, r, _, _ in b3) == sum(r for _, r, _, _ in b1)


def test_a_window_keeps_the_foreign_patch_partner_within_its_chunk(tmp_path):
    """Depth and patching rows too: the foreign-scenario patch takes the next scenario of the same chunk, which
    a window of two 2-scenario chunks must not change into a scenario of the other chunk (gap-v1's first four
    scenarios all have three options: across the window the second one's partner would be the third)."""
    study = lambda: GapStudy(readouts="D,J0,depth")  # noqa: E731
    alone, _ = gap(tmp_path, "alone", 1, study(), profile=DEPTH.name, panel="gap-v1")
    together, _ = gap(tmp_path, "together", 2, study(), profile=DEPTH.name, panel="gap-v1")
    assert_same_tables(alone, together, [("probes", "probe_id"), ("depth", DEPTH_KEY + ["readout", "lens", "layer"]),
                                         ("patching", DEPTH_KEY + ["source", "layer"])])
    patched = table(together, "patching", DEPTH_KEY + ["source", "layer"])
    foreign = patched[patched.source.str.startswith("foreign")]
    chunk_of = {sid: i // DEPTH.chunk_size for i, sid in enumerate(json.loads((together / "manifest.json").read_text())
                                                                     ["panel"]["records_read"])}
    assert len(foreign) and (foreign.source_scenario_id != foreign.scenario_id).all()
    assert (foreign.source_scenario_id.map(chunk_of) == foreign.scenario_id.map(chunk_of)).all()


def test_a_window_resumes_and_a_run_resumes_under_another_window(tmp_path):
    alone, _ = gap(tmp_path, "alone", 1)
    with pytest.raises(Interrupted):  # the testing aid stops inside the first window, after two chunks
        gap(tmp_path, "resumed", 3, stop_after_chunks=2)
    written = sorted(p.name for p in (tmp_path / "resumed" / "chunks").glob("scenarios-*.parquet"))
    assert written == ["scenarios-00000.parquet", "scenarios-00001.parquet"]
    path, logs = gap(tmp_path, "resumed", 2)
    assert sum("already finished, skipped" in line for line in logs) == 2
    assert sum("window of 2 chunks" in line for line in logs) == 2
    assert_same_tables(alone, path, [("probes", "probe_id"), ("scenarios", "scenario_id")])


def test_an_nsi_window_gives_each_chunk_its_own_rows(tmp_path):
    paths = []
    for name, window in (("alone", 1), ("together", 3)):
        options = RunOptions(model=ModelOptions("tiny-llama3"), out=str(tmp_path / name), progress=False, window=window,
                             limit=4)
        paths.append(run(NsiStudy(), options, log=lambda _: None))
    assert_same_tables(*paths, [("nsi_replies", ["dilemma_id", "framing", "sample"]),
                                ("nsi_continuous", ["dilemma_id", "framing"])])
    assert len(table(paths[1], "nsi_replies", ["dilemma_id", "framing", "sample"])) > 8
    assert_chunks_hold_their_records(paths[1], {"nsi_replies": "dilemma_id", "nsi_continuous": "dilemma_id"}, 1)


def test_window_defaults_and_refusals(tmp_path, monkeypatch):
    assert window_for(None, "cuda", True, "x") == WINDOW_DEFAULT["cuda"] > 1
    assert window_for(None, "cpu", True, "x") == 1 and window_for(5, "cpu", True, "x") == 5
    assert window_for(None, "cuda", False, "x") == 1
    assert hasattr(GapRunner, "run_window") and hasattr(NsiRunner, "run_window")
    assert not hasattr(SteerRunner, "run_window") and not hasattr(ServedGapRunner, "run_window")
    assert windows([[1], [2], [3]], 2) == [[1, 2], [3]]
    assert windows([[1], [2], [3], [4], [5]], 2, world=2) == [[1, 3], [5], [2, 4]]  # each rank's chunks in turn
    # Refused in one line before any model loads: the steering grid and served models read one chunk at a time.
    import engine.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises(ReadoutError, match="^--window: the steering study computes one chunk at a time; use --window 1$"):
        run(SteerStudy(settings=SteerSettings(layers=(1,))),
            RunOptions(model=ModelOptions("tiny-qwen2"), out=str(tmp_path / "s"), progress=False, window=2))
    served = RunOptions(model=ModelOptions("m", served=object()), out=str(tmp_path / "v"), progress=False, window=3)
    with pytest.raises(ReadoutError, match="^--window: a served model's run computes one chunk at a time"):
        run(GapStudy(), served)
    assert not (tmp_path / "s").exists() and not (tmp_path / "v").exists()
    options = RunOptions(model=ModelOptions("tiny-llama3"), profile=PROFILE.name, progress=False)
    _, _, header, _ = plan_run(GapStudy(), options, "h200")
    assert f"decoded {WINDOW_DEFAULT['cuda']} chunks at a time" in header
    _, _, header, _ = plan_run(GapStudy(), dataclasses.replace(options, window=2), "h200")
    assert "4 records in 4 chunks of 1, decoded 2 chunks at a time" in header
    result = CliRunner().invoke(cli, ["run", "--model", "tiny-llama3", "--window", "0", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--window" in result.output


@pytest.mark.heavy  # several windows' runs, each against one chunk at a time
def test_each_batch_is_read_on_its_rows_caches_which_are_then_let_go(tmp_path, monkeypatch):
    """The runner reads a decoding batch's rows right after the batch, on the rows' own caches, and lets them go
    before the next batch decodes: under a row-cache limit that holds one batch's rows but not a stage's, every
    row is still held (none dropped) and what is held never exceeds the limit. The reads equal those of a run that
    holds no row at all (every read re-encodes prompt and text)."""
    import engine.rowcache as rowcache
    import readouts.gap.recipe as recipe

    stores = []

    class Counting(rowcache.RowCaches):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.added, self.peak = 0, 0
            stores.append(self)

        def add_row(self, prompt, tokens, own):
            held = super().add_row(prompt, tokens, own)
            if held:
                self.added += sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in own)
                self.peak = max(self.peak, self.held_bytes)
            return held

    monkeypatch.setattr(recipe, "RowCaches", Counting)
    monkeypatch.setitem(batching.DEFAULT_BOUNDS, "generate", {**batching.DEFAULT_BOUNDS["generate"], "cpu": (16384, 6)})
    monkeypatch.setattr(rowcache, "DEFAULT_CPU_BYTES", 1 << 30)
    free, _ = gap(tmp_path, "free", 3)
    limit = max(s.peak for s in stores)  # the most one batch's rows held at once
    assert all(s.rows_dropped == 0 for s in stores)
    stores.clear()
    monkeypatch.setattr(rowcache, "DEFAULT_CPU_BYTES", limit)
    bounded, _ = gap(tmp_path, "bounded", 3)
    generated = [s for s in stores if s.added]
    assert generated and all(s.rows_dropped == 0 and s.peak <= limit for s in generated)
    assert max(s.added for s in generated) > 2 * limit  # a stage's rows would not have fitted at once
    stores.clear()
    monkeypatch.setattr(rowcache, "DEFAULT_CPU_BYTES", 1)  # no row held: every read re-encodes
    none, _ = gap(tmp_path, "none", 3)
    assert stores and all(s.added == 0 for s in stores)
    assert_same_tables(none, bounded, [("probes", "probe_id"), ("scenarios", "scenario_id")])
    assert_same_tables(free, bounded, [("probes", "probe_id")])


def test_a_generate_that_never_hands_over_its_batches_is_refused(monkeypatch):
    """The runner reads generated rows only as `generate` hands each batch over (`on_rollouts`): one that returns
    without doing so would leave a stage with no reads, so the runner refuses it by name."""
    import readouts.gap.recipe as recipe
    from engine.generation import Rollout
    from panels.schema import load_panel
    from tests.helpers import get_model

    lm = get_model("tiny-qwen2")
    monkeypatch.setattr(recipe, "generate", lambda model, prompts, **kw: [[Rollout((1, 2), True, True)] * kw["n"]
                                                                          for _ in prompts])
    runner = recipe.GapRunner(lm, PROFILE, ("J",), 0, False, "gap-v1", "tiny-qwen2")
    with pytest.raises(RuntimeError, match="without handing .* to on_rollouts"):
        runner.run(load_panel("gap-v1").records[:1])
