"""`readout steer` end to end on a tiny model, against references computed here: the pressure and judgment
directions from `output_hidden_states` of plain forwards over the direction part, and every steered read from a plain
forward with a hand-written hook adding strength x that direction after the layer at the read position. Also the
manifest (the three parts, settings, the rules), which conditions each part is read under (random nulls on the test
part only), the label-shuffled null, the capability loss under the readouts' own intervention (held to read-position
scoring of each prefix), resume, a refused resume under other settings, and bad input (one line naming the option or
file, exit 2)."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from contract.names import UNSTEERED
from contract.readouts import readout
from engine.errors import ReadoutError
from engine.render import encode_prompt
from panels.frames import render
from panels.schema import load_panel
from readouts.driver import Interrupted, ModelOptions, RunOptions
from readouts.driver import run as run_study
from readouts.gap import profile as gap_profile
from readouts.gap.prompts import prompt_of
from readouts.gap.recipe import orders_for
from readouts.steer.study import SteerSettings, SteerStudy
from tests.helpers import get_model

MODEL = "tiny-qwen2"
PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="steer-test", orders={"D": 2, "J0": 1, "control": 1, "raw": 1},
                              chunk_size=1)
SETTINGS = SteerSettings(direction="pressure", layers=(1, 2), strengths=(-3.0, 2.0), positions="read", random=1)
LIMIT = 6


def options(out, **kw):
    return RunOptions(model=ModelOptions(MODEL), panel="gap-v1", profile=PROFILE.name, limit=LIMIT, out=str(out),
                      progress=False, **kw)


def steer(settings, out, **kw):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
        return run_study(SteerStudy(settings=settings), options(out, **kw), log=lambda _: None)


@pytest.fixture(scope="module")
def steer_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("steer") / "run"
    with pytest.raises(Interrupted):
        steer(SETTINGS, out, stop_after_chunks=1)
    path = steer(SETTINGS, out)  # resumes: the first chunk is kept
    return path


def states(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True, use_cache=False)
    return torch.stack([h[0, -1].float() for h in out.hidden_states[:-1]] + [_last_layer_output(model, ids)])


def _last_layer_output(model, ids):
    """The last layer's output before the final norm (transformers' last hidden state is after it)."""
    got = {}
    handle = model.base_model.layers[-1].register_forward_hook(lambda m, a, out: got.setdefault("h", out[0] if isinstance(out, tuple) else out))
    try:
        with torch.inference_mode():
            model(input_ids=torch.tensor([list(ids)]), use_cache=False)
    finally:
        handle.remove()
    return got["h"][0, -1].float()


def reference_direction(lm, scenarios, plus, minus):
    diffs = []
    for s in scenarios:
        for order in orders_for(s, readout("D"), PROFILE, 0):
            a, b = (encode_prompt(lm.tokenizer, prompt_of(render(s, f, c, order, PROFILE.frames))) for f, c in (plus, minus))
            diffs.append(states(lm.model, a) - states(lm.model, b))
    return torch.stack(diffs).mean(0)


def hooked_p(lm, scenario, frame, cell, letters_order, depth, vector):
    index = {o.id: i for i, o in enumerate(scenario.options)}
    r = render(scenario, frame, cell, tuple(index[o] for o in letters_order), PROFILE.frames)
    ids = encode_prompt(lm.tokenizer, prompt_of(r))

    def add(h):
        h = h.clone()
        h[0, -1] += vector
        return h

    handle = None if vector is None else lm.model.base_model.layers[depth - 1].register_forward_hook(
        lambda m, a, out: (add(out[0]), *out[1:]) if isinstance(out, tuple) else add(out))
    try:
        with torch.inference_mode():
            logits = lm.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    finally:
        if handle is not None:
            handle.remove()
    probs = logits.softmax(-1)
    mass = [float(sum(probs[t] for t in ids)) for ids in lm.letters(tuple(r.letters)).token_ids]
    return mass[r.letters.index(r.violating_letter)] / sum(mass)


def test_steered_reads_equal_a_hooked_plain_forward(steer_run):
    lm = get_model(MODEL)
    manifest = json.loads((steer_run / "manifest.json").read_text())
    st = manifest["steering"]
    assert st["direction"] == "pressure" and st["layers"] == [1, 2] and st["strengths"] == [-3.0, 2.0]
    assert st["positions"] == "read" and st["random_seeds"] == [0] and st["split_seed"] == 0
    parts = {name: set(st[name]) for name in ("train", "selection", "test")}
    assert all(parts.values()) and not parts["train"] & parts["selection"] and not parts["train"] & parts["test"]
    assert not parts["selection"] & parts["test"] and set(st["held_out"]) == parts["selection"] | parts["test"]
    assert st["rules"]["threshold"] == 0.5 and st["rules"]["margin"] == 0.05 and "selection part" in st["rules"]["selection_rule"]
    by_id = {r.id: r for r in load_panel("gap-v1").records}
    df = pd.read_parquet(steer_run / "steering.parquet")
    assert set(df.scenario_id) == set(st["held_out"])
    assert {p: set(g.scenario_id) for p, g in df.groupby("part")} == {"selection": parts["selection"], "test": parts["test"]}
    direction = reference_direction(lm, [by_id[i] for i in st["train"]], ("agent", "primary"), ("agent", "twin"))
    for d in (1, 2):
        assert abs(manifest["steering_norms"][str(d)] - float(direction[d].norm())) < 1e-4
        assert manifest["steering_residual_norms"][str(d)] > manifest["steering_norms"][str(d)] > 0
    # Selection part: unsteered + 2 layers x 2 strengths x (direction, shuffled); test part: + one random direction.
    for part, conditions in (("selection", 1 + 2 * 2 * 2), ("test", 1 + 2 * 2 * 3)):
        rows = df[df.part == part]
        assert len(rows) == conditions * (rows.direction == "none").sum(), part
    assert set(df[df.direction == "random"].part) == {"test"}
    conditions = 1 + 2 * 2 * 3
    checked = 0
    for (direction_name, layer, strength), g in df[df.direction.isin(["none", "pressure"])].groupby(
            ["direction", df.layer.fillna(0), "strength"]):
        for row in g.head(3).itertuples():
            frame = {"D": "agent", "J0": "judge_letter", "control": "control"}[row.readout]
            letters_order = _order_of(by_id[row.scenario_id], row)
            vector = None if direction_name == "none" else direction[int(layer)] * strength
            want = hooked_p(lm, by_id[row.scenario_id], frame, row.cell, letters_order, int(layer), vector)
            assert abs(row.p_violating - want) < 1e-5, (direction_name, layer, strength, row.readout)
            checked += 1
    assert checked >= 15
    # The steering moved the reads, and the random direction's reads differ from the direction's.
    test = df[df.part == "test"]
    base = test[test.direction == "none"].p_violating.to_numpy()
    moved = test[(test.direction == "pressure") & (test.strength == -3.0) & (test.layer == 2)].p_violating.to_numpy()
    rand = test[(test.direction == "random") & (test.strength == -3.0) & (test.layer == 2)].p_violating.to_numpy()
    assert np.abs(moved - base).max() > 1e-3 and np.abs(moved - rand).max() > 1e-3
    cap = pd.read_parquet(steer_run / "steer_capability.parquet")
    assert len(cap) == conditions and (cap.tokens > 10).all() and cap.loss.nunique() > 1
    shuffled = test[(test.direction == "shuffled") & (test.strength == -3.0) & (test.layer == 2)].p_violating.to_numpy()
    assert np.abs(shuffled - moved).max() > 1e-3


def _order_of(scenario, row):
    """The option ids in the order the row read them: its readout's seeded orders at its order index."""
    order = orders_for(scenario, readout(row.readout), PROFILE, 0)[row.order_index]
    return [scenario.options[i].id for i in order]


def test_stats_and_report_of_a_steering_run(steer_run, tmp_path):
    from readouts.report.gather import gather
    from readouts.report.render import page
    from stats.steer import STEER_FIGURES, STEER_MARKDOWN, run_steer_report

    lines = run_steer_report(steer_run, n_boot=200)
    stats = steer_run / "stats"
    assert all((stats / f).is_file() for f in STEER_FIGURES) and (stats / STEER_MARKDOWN).is_file()
    changes = pd.read_csv(stats / "steer_scenarios.csv")
    assert set(changes.direction) == {"pressure", "shuffled"} and (changes.change == changes.E - changes.E0).all()
    assert any(line.startswith("steer: pressure: verdict: ") for line in lines), lines
    assert any(line.startswith("steer: shuffled: ") for line in lines), lines
    grid = pd.read_csv(stats / "steer_grid.csv")
    assert set(grid.quantity) >= {"E", "dE", "twin_move", "J0_move", "E0"} and set(grid.part) == {"selection", "test"}
    verdict = pd.read_csv(stats / "steer_verdict.csv")
    assert list(verdict.direction) == ["pressure", "shuffled"]
    selection = pd.read_csv(stats / "steer_selection.csv")
    assert len(selection) == 2 * 2 * 2 and set(selection.columns) >= {"reduction", "kept", "twin_move_high"}
    (section,) = gather([steer_run]).sections
    assert section.kind == "steering" and [f.name for f in section.figures] == list(STEER_FIGURES) and section.tables
    assert "Steering (selection and test parts)" in page(gather([steer_run]))


def test_judgment_direction_equals_the_plain_forward_mean():
    from readouts.steer.directions import contrast_direction

    lm = get_model(MODEL)
    scenarios = load_panel("gap-v1").records[:2]
    got = contrast_direction(lm, scenarios, "judgment", PROFILE, 0)
    want = reference_direction(lm, scenarios, ("judge_letter", "primary"), ("agent", "primary"))
    assert (got - want).abs().max() < 1e-4 * max(1.0, float(want.abs().max()))
    assert float(want[1:].norm()) > 1e-3


def test_a_direction_over_orders_not_balanced_by_position_is_named_and_warned(steer_run, tmp_path):
    """D's orders put each option at each letter equally often only where a scenario's option count divides their
    number (panels.orders); the contrast is a mean over them, so where they do not it also carries letter position.
    The run names those training scenarios in its manifest and says so in its log; with six orders (two- and three-
    option scenarios) it names none and is silent."""
    from readouts.steer.directions import unbalanced_orders

    manifest = json.loads((steer_run / "manifest.json").read_text())
    records = {r.id: r for r in load_panel("gap-v1").records}
    expected = [i for i in manifest["steering"]["train"] if PROFILE.orders["D"] % len(records[i].options)]
    assert expected and manifest["steering_unbalanced_orders"] == expected
    six = dataclasses.replace(PROFILE, orders={**PROFILE.orders, "D": 6})
    assert unbalanced_orders([records[i] for i in manifest["steering"]["train"]], six, 0) == []
    for profile, warned in ((PROFILE, True), (six, False)):
        lines = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(gap_profile.PROFILES, PROFILE.name, profile)
            run_study(SteerStudy(settings=dataclasses.replace(SETTINGS, layers=(1,), strengths=(2.0,), random=0, shuffled=False)),
                      options(tmp_path / f"run{profile.orders['D']}"), log=lines.append)
        said = [x for x in lines if x.startswith("warning: --direction pressure")]
        assert len(said) == warned and (not warned or all(i in said[0] for i in expected)), lines


def test_resume_under_other_settings_is_refused(steer_run):
    with pytest.raises(ReadoutError, match="manifest|different|settings"):
        steer(dataclasses.replace(SETTINGS, strengths=(1.0,)), steer_run)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    from cli.main import main

    bad_file = tmp_path / "v.npy"
    np.save(bad_file, np.zeros(7, dtype=np.float32))
    cases = [(["--layers", "9"], "--layers"), (["--layers", "1", "--strengths", "a,b"], "--strengths"),
             (["--layers", "1", "--direction", str(bad_file)], "shape"),
             (["--layers", "1", "--direction", "sideways"], "--direction")]
    for extra, field in cases:
        with pytest.raises(SystemExit) as exc:
            main(["steer", "--model", MODEL, "--panel", "gap-v1", "--limit", "4", "--out", str(tmp_path / "r"),
                  "--no-progress", "--force", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and field in err[0], (extra, err)


def test_the_grid_shows_its_own_progress_while_it_runs(tmp_path, capsys):
    """The grid of a chunk is one scoring call: with progress on, that call's bar ("scoring", one tick per steered
    read) is drawn while it runs, not only the run's bar once the chunk is done; so is the capability text's bar (one
    tick per condition)."""
    settings = dataclasses.replace(SETTINGS, layers=(1,), strengths=(2.0,), random=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
        run_study(SteerStudy(settings=settings), dataclasses.replace(options(tmp_path / "run"), limit=3, progress=True),
                  log=lambda _: None)
    err = capsys.readouterr().err
    assert "scoring" in err and "capability" in err


def test_plan_counts_the_reads_the_grid_makes(steer_run, monkeypatch):
    """`readout steer --plan` against the run itself: the unsteered and steered reads are the steering table's rows,
    the capability passes its rows, and the direction stage the prompts the contrast scores (counted by a spy on
    the real scorer)."""
    from readouts.driver import plan_run
    from readouts.steer import directions

    monkeypatch.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
    study = SteerStudy(settings=SETTINGS)
    rows, _, _, _ = plan_run(study, options(steer_run.parent / "plan"), "h200")
    by = {r["stage"]: r for r in rows}
    table = pd.read_parquet(steer_run / "steering.parquet")
    assert by["D"]["reads"] + by["J0"]["reads"] + by["control"]["reads"] == (table.direction == UNSTEERED).sum()
    assert by["grid"]["reads"] == (table.direction != UNSTEERED).sum()
    assert by["grid"]["computed_tokens"] == by["grid"]["reads"]  # read-position steering: the last token only
    assert by["capability"]["prompts"] == len(pd.read_parquet(steer_run / "steer_capability.parquet"))
    scored = []
    real = directions.score_ids
    monkeypatch.setattr(directions, "score_ids", lambda model, seqs, *a, **k: scored.append(len(seqs)) or real(model, seqs, *a, **k))
    directions.contrast_direction(get_model(MODEL), study.train, "pressure", PROFILE, 0)
    assert by["directions"]["prompts"] == scored[0]


@pytest.mark.parametrize("family", ["tiny-qwen2", "tiny-llama3", "tiny-olmo3"])
def test_read_position_capability_equals_each_prefix_steered_at_its_read_position(family):
    """The capability loss under read-position steering (the text read twice over in one forward, each position of
    the copy steered alone) equals the mean of -log p(next token) read by engine.steering.score_steered on each
    prefix of the text with the vector at its read position; an every-position steering gives another loss."""
    from engine.letters import LetterTokens
    from engine.steering import Steering, score_steered, token_loss
    from readouts.steer.capability import capability_ids, capability_losses

    lm = get_model(family)
    ids = capability_ids(lm.tokenizer)[:80]
    for depth in (0, 1):  # below the last layer (after it, one position's vector reaches its own logits only)
        st = Steering(depth, torch.randn(lm.model.config.hidden_size, generator=torch.Generator().manual_seed(depth)) * 3,
                      1.5, "read")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("readouts.steer.capability.capability_ids", lambda tok: ids)
            (got, n), = capability_losses(lm, [st], "read")
        reads = range(len(ids) - 1)
        out = score_steered(lm.model, [ids[: t + 1] for t in reads], [LetterTokens(("x",), ((ids[t + 1],),), (("",),))
                                                                    for t in reads], st, pad_id=lm.pad_id)
        want = float(np.mean([-np.log(r.mass[0]) for r in out]))
        assert n == len(ids) - 1 and abs(got - want) < 1e-5, (depth, got, want)
        assert abs(got - token_loss(lm.model, ids, st)[0]) > 1e-3


def test_shuffled_direction_swaps_a_seeded_half_of_the_scenarios():
    """Four scenarios, two orders each, each scenario's contrast a unit vector of its own: the shuffled null is the
    mean with two scenarios' signs flipped (both orders), scaled to the direction's norm; another seed flips others."""
    from readouts.steer.directions import shuffled_direction

    eye = torch.eye(4)
    diffs = torch.stack([eye[i // 2] for i in range(8)])[:, None, :].repeat(1, 2, 1)  # [pairs, depths 2, hidden 4]
    ids = [f"s{i // 2}" for i in range(8)]
    norms = torch.tensor([2.0, 3.0])
    got = shuffled_direction(diffs, ids, 0, norms)
    assert torch.allclose(got.norm(dim=-1), norms)
    signs = torch.sign(got[0])
    assert (signs == -1).sum() == 2 and (signs == 1).sum() == 2
    others = {tuple(torch.sign(shuffled_direction(diffs, ids, seed, norms)[0]).tolist()) for seed in range(8)}
    assert len(others) > 1


def test_split_seeds_run_one_directory_each_and_print_the_pass_rate(tmp_path, capsys):
    """`readout steer --split-seeds 2 --out DIR`: one run per seed in DIR/seed-0 and DIR/seed-1, each with its own
    split, then the pass rate of each direction over the two (here 0 of 2: the tiny model has no gap to cut), also
    in DIR/steer_seeds.json."""
    from cli.main import main
    from readouts.steer.seeds import SEEDS_FILE, seed_out

    assert seed_out("x", 3, 1) == "x" and seed_out("x", 3, 2) == "x/seed-3" and seed_out(None, 3, 2) is None
    out = tmp_path / "seeds"
    with pytest.raises(SystemExit) as exc:
        main(["steer", "--model", MODEL, "--panel", "gap-v1", "--limit", "6", "--layers", "1", "--strengths=-2",
              "--random", "2", "--split-seeds", "2", "--out", str(out), "--no-progress"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    manifests = [json.loads((out / f"seed-{s}" / "manifest.json").read_text()) for s in (0, 1)]
    assert [m["steering"]["split_seed"] for m in manifests] == [0, 1]
    assert manifests[0]["steering"]["test"] != manifests[1]["steering"]["test"]
    record = json.loads((out / SEEDS_FILE).read_text())
    assert record["pass_rate"]["pressure"]["n"] == 2 and set(record["pass_rate"]) == {"pressure", "shuffled"}
    assert "steer: pressure: passes on 0 of 2 split seeds" in printed, printed
