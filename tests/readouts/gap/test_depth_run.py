"""The depth readout end to end on a tiny model, against references computed here from a plain forward: every
depth row's letter mass from `output_hidden_states` through the model's norm and head, and every patched row from
a forward with a hand-written hook carrying the source prompt's hidden state."""


import pandas as pd
import pytest
import torch

from contract.tables import DEPTH, PATCH_GRID, PATCHING, PROBES
from panels.schema import load_panel
from readouts.driver import ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap import profile as gap_profile
from readouts.gap.study import GapStudy, parse_readouts
from tests.helpers import DEPTH_PROFILE, FRAME_OF, depth_prompt, forward_states, get_model, letter_mass_of, order_perm

MODEL = "tiny-llama3"


@pytest.fixture(scope="module")
def depth_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("depth") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, DEPTH_PROFILE.name, DEPTH_PROFILE)
        run_study(GapStudy(readouts="D,J0,depth"), RunOptions(model=ModelOptions(MODEL), profile=DEPTH_PROFILE.name,
                                                            limit=4, out=str(out), progress=False), log=lambda _: None)
    return out


def test_depth_rows_equal_the_lens_of_a_plain_forward(depth_run):
    lm = get_model(MODEL)
    model = lm.model
    panel = {s.id: s for s in load_panel("gap-v2").records}
    df = pd.read_parquet(depth_run / DEPTH.file)
    DEPTH.check(df, "depth")
    assert set(df.readout) == {"D", "J0"} and set(df.cell) >= {"primary", "twin"}
    n = model.config.num_hidden_layers
    assert set(df.layer) == set(range(n + 1)) and df.n_layers.eq(n).all()
    probes = df.groupby(["scenario_id", "cell", "readout", "order_index"])
    checked = 0
    for (sid, cell, readout, _), rows in list(probes)[:6]:
        ids, _ = depth_prompt(lm, panel[sid], FRAME_OF[readout], cell, rows.order.iloc[0])
        out = forward_states(model, ids)
        for row in rows.itertuples():
            if row.layer < n:  # hidden_states[n] is already normed: the last depth is the model's own logits
                with torch.inference_mode():
                    logits = model.lm_head(model.base_model.norm(out.hidden_states[row.layer][0, -1]))
            else:
                logits = out.logits[0, -1]
            want = letter_mass_of(lm, logits, row.letters)
            assert max(abs(a - b) for a, b in zip(want, row.mass)) < 1e-6, (sid, cell, readout, row.layer)
            checked += 1
    assert checked == 6 * (n + 1)


def hand_patched_logits(model, ids, layer, vector):
    """Agent prompt forward with layer `layer`'s output (0: the embeddings') at the last token set to `vector`."""
    def write(h):
        h = h.clone()
        h[0, -1] = vector
        return h

    module = model.get_input_embeddings() if layer == 0 else model.base_model.layers[layer - 1]
    handle = module.register_forward_hook(
        lambda m, a, out: (write(out[0]), *out[1:]) if isinstance(out, tuple) else write(out))
    try:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0, -1]
    finally:
        handle.remove()


def test_patch_rows_equal_a_hand_patched_forward(depth_run):
    lm = get_model(MODEL)
    model = lm.model
    n = model.config.num_hidden_layers
    panel = {s.id: s for s in load_panel("gap-v2").records}
    df = pd.read_parquet(depth_run / PATCHING.file)
    PATCHING.check(df, "patching")
    assert set(df.source) == {"judge", "twin_agent", "foreign_judge", "foreign_agent"} and set(df.cell) == {"primary"}
    assert set(df.layer) == set(range(n + 1))
    foreign = df[df.source.str.startswith("foreign")]
    assert (foreign.source_scenario_id != foreign.scenario_id).all()
    # Both foreign controls patch from the same partner.
    partners = foreign.groupby(["scenario_id", "order_index"]).source_scenario_id.nunique()
    assert (partners == 1).all()
    rows_of = {s: set(map(tuple, foreign[foreign.source == s][["scenario_id", "order_index", "layer"]].values.tolist()))
               for s in ("foreign_judge", "foreign_agent")}
    assert rows_of["foreign_judge"] == rows_of["foreign_agent"] != set()
    for row in df[df.layer < n].itertuples():
        agent_ids, _ = depth_prompt(lm, panel[row.scenario_id], "agent", "primary", row.order)
        source = panel[row.source_scenario_id]
        frame, cell = {"twin_agent": ("agent", "twin"), "foreign_agent": ("agent", "primary")}.get(row.source, ("judge_letter", "primary"))
        # The same order (option indices) applied to the source's options.
        source_ids, _ = depth_prompt(lm, source, frame, cell, None, perm=order_perm(panel[row.scenario_id], row.order))
        assert len(source.options) == len(panel[row.scenario_id].options)
        vector = forward_states(model, source_ids).hidden_states[row.layer][0, -1]
        want = letter_mass_of(lm, hand_patched_logits(model, agent_ids, row.layer, vector), row.letters)
        # Relative: a tiny random model puts ~1e-3 of its mass on each letter, so an absolute 1e-6 would pass a source
        # prompt read in the wrong option order (the same tokens, other positions).
        assert max(abs(a - b) / b for a, b in zip(want, row.mass)) < 1e-4, (row.scenario_id, row.source, row.layer)
        plain = letter_mass_of(lm, forward_states(model, agent_ids).logits[0, -1], row.letters)
        v = row.letters.index(row.violating_letter)
        assert abs(plain[v] / sum(plain) - row.p_agent) < 1e-6
    # At the last depth the patched read is the source's own read.
    last = df[df.layer == n]
    assert (last.p_violating - last.p_source).abs().max() < 1e-5


def test_depth_is_a_readouts_token():
    assert parse_readouts("depth", chat=True) == ("D", "J0", "raw", "control")
    assert parse_readouts("D,depth", chat=True) == ("D",)
    assert parse_readouts("depth", chat=False) == ("raw",)
    assert GapStudy(readouts="D,depth").tables[-3:] == (DEPTH.name, PATCHING.name, PATCH_GRID.name)
    assert GapStudy(readouts="D").tables == GapStudy().tables


def test_readout_stats_and_report_on_a_depth_run(depth_run, tmp_path):
    from readouts.report import write_report
    from stats.depth.names import DEPTH_FIGURES, DEPTH_TABLES
    from stats.depth.report import run_depth_report

    lines = run_depth_report(depth_run, out_dir=depth_run / "stats", n_boot=200)
    assert any(line.startswith("depth: wrote") for line in lines)
    grid = [line for line in lines if line.startswith("depth: patching grid, noising span: ")]
    assert len(grid) == 1 and "; the filler swap moves at most " in grid[0]
    for name in (*DEPTH_FIGURES, *DEPTH_TABLES):
        assert (depth_run / "stats" / name).is_file(), name
    out = tmp_path / "report.html"
    write_report([str(depth_run)], out, max_items=1)
    html = out.read_text()
    assert "Through depth: " in html and 'data-kind="depth"' in html
    depth_part = html[html.index('data-kind="depth"'):]
    assert all(name in depth_part for name in (*DEPTH_FIGURES, *DEPTH_TABLES))


def test_patch_grid_rows_equal_hand_patched_forwards(depth_run):
    """patch_grid.parquet: every scenario x order x direction x group x patched depth, and each read-position row of
    the grid equal to a forward of the prompt with a hand-written hook carrying the other prompt's hidden state."""
    import dataclasses
    import math

    from contract.names import PATCH_DIRECTIONS, PATCH_GROUPS, PATCH_PAIRS
    from readouts.gap.depth import patch_depths

    lm = get_model(MODEL)
    model = lm.model
    n = model.config.num_hidden_layers
    panel = {s.id: s for s in load_panel("gap-v2").records}
    df = pd.read_parquet(depth_run / PATCH_GRID.file)
    PATCH_GRID.check(df, "patch_grid")
    depths = patch_depths(n, DEPTH_PROFILE.grid_stride)
    per = df.groupby(["scenario_id", "order_index"]).size()
    assert len(per) == 4 * DEPTH_PROFILE.patch_orders
    assert (per == len(PATCH_PAIRS) * 2 * len(PATCH_GROUPS) * len(depths)).all()
    assert set(df.direction) == set(PATCH_DIRECTIONS) and set(df.layer) == set(depths)
    swap = df[df.pair == PATCH_PAIRS[1]]
    assert df[df.pair == PATCH_PAIRS[0]].filler_of.isna().all() and (swap.filler_of != swap.scenario_id).all()
    checked = 0
    for row in df[(df.group == "read") & (df.layer < n)].itertuples():
        s = panel[row.scenario_id]
        perm = tuple(int(x) for x in row.order.split(","))
        if row.pair == PATCH_PAIRS[0]:
            first, second = (s, "primary"), (s, "twin")
        else:  # the twin, and the twin with the partner's filler sentence
            first, second = (s, "twin"), (dataclasses.replace(s, filler=panel[row.filler_of].filler), "twin")
        (clean, clean_cell), (source, source_cell) = (first, second) if row.direction == "noising" else (second, first)
        ids, r = depth_prompt(lm, clean, FRAME_OF["D"], clean_cell, None, perm=perm)
        source_ids, _ = depth_prompt(lm, source, FRAME_OF["D"], source_cell, None, perm=perm)
        assert ids != source_ids
        vector = forward_states(model, source_ids).hidden_states[row.layer][0, -1]
        mass = letter_mass_of(lm, hand_patched_logits(model, ids, row.layer, vector), r.letters)
        v = r.letters.index(r.violating_letter)
        logs = [math.log(m) for m in mass]
        want = logs[v] - sum(x for i, x in enumerate(logs) if i != v) / (len(logs) - 1)
        assert abs(want - row.ld) < 1e-4, (row.scenario_id, row.direction, row.layer)
        checked += 1
    assert checked == len(per) * len(PATCH_PAIRS) * 2 * len([d for d in depths if d < n])


def patching_forwards(run) -> int:
    """The forward passes a depth run's tables show its patching made: each patching row is a patched forward; each
    distinct source prompt (a judge prompt, the foreign partner's agent prompt) one more read (the twin's agent read
    is the run's own); each grid row a patched forward, and each scenario, order and pair four more (both prompts'
    streams and plain reads)."""
    patched, grid = pd.read_parquet(run / PATCHING.file), pd.read_parquet(run / PATCH_GRID.file)
    read = patched[patched.source != "twin_agent"]
    frames = read.source.map({"judge": "judge", "foreign_judge": "judge", "foreign_agent": "agent"})
    sources = len(set(zip(read.source_scenario_id, frames, read.order)))
    return len(patched) + sources + len(grid) + 4 * len(grid.groupby(["scenario_id", "order_index", "pair"]))


def test_the_plan_counts_every_patching_forward_the_run_made(depth_run):
    """`--plan`'s depth stage: as many forward passes as the run's tables show it made (patching_forwards)."""
    import json

    from engine.generation import batch_bounds
    from readouts.gap.plan import DEPTH_STAGE

    lm = get_model(MODEL)
    manifest = json.loads((depth_run / "manifest.json").read_text())
    panel = {s.id: s for s in load_panel("gap-v2").records}
    records = [panel[i] for i in manifest["panel"]["records_read"]]
    patched, grid = pd.read_parquet(depth_run / PATCHING.file), pd.read_parquet(depth_run / PATCH_GRID.file)
    made = patching_forwards(depth_run)
    n = lm.model.config.num_hidden_layers
    bounds = batch_bounds(lm.model, torch.device("cpu"), None)
    stages = GapStudy(readouts="D,J0,depth").workload(lm.tokenizer, [records], DEPTH_PROFILE, 0, bounds, n)
    (depth,) = [st for st in stages if st.stage == DEPTH_STAGE]
    assert depth.prompts == made and len(patched) > 0 and len(grid) > 0
    assert depth.prompt_tokens == depth.computed_tokens > made * 20
    plain = GapStudy(readouts="D,J0").workload(lm.tokenizer, [records], DEPTH_PROFILE, 0, bounds, n)
    assert DEPTH_STAGE not in {st.stage for st in plain}


def test_the_progress_bar_counts_the_reads_and_the_patching_forwards(tmp_path, monkeypatch):
    """A depth run's progress bar moves through its patching too: its total is the run's reads plus the forwards its
    tables show the patching made, and the bar ends there."""
    from tqdm.auto import tqdm

    bars = []

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append(self)

    monkeypatch.setattr("tqdm.auto.tqdm", Bar)
    monkeypatch.setitem(gap_profile.PROFILES, DEPTH_PROFILE.name, DEPTH_PROFILE)
    out = tmp_path / "run"
    run_study(GapStudy(readouts="D,J0,depth"), RunOptions(model=ModelOptions(MODEL), profile=DEPTH_PROFILE.name,
                                                        limit=4, out=str(out), progress=True), log=lambda _: None)
    (bar,) = [b for b in bars if getattr(b, "desc", "").startswith(MODEL)]  # the run's own bar
    reads = len(pd.read_parquet(out / PROBES.file))
    made = patching_forwards(out)
    assert made > reads > 0 and bar.total == reads + made and bar.n == bar.total
