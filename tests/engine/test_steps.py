"""The decode loop with checks every k steps (engine/steps.py): the rollouts (greedy and sampled, stops,
budgets, tied lengths, compaction) are those of checking every step, on every tiny family and through every
decode path; a nucleus wider than the draw's head decodes its window again (rewind) to the same tokens; and
between checks the loop reads nothing back from the device (host-work counter)."""

import pytest

import engine.decode as decode
import engine.sampling as sampling
from engine.generation import generate, stop_token_ids
from engine.hostcount import HostCounter
from tests.helpers import PATHS, TINY, get_model, prompts_for, use_path


def _run(lm, prompts, **kw):
    args = dict(max_new_tokens=[11, 4, 9, 7], stop_ids=_stops(lm, prompts), n=3, greedy_first=True,
                temperature=0.9, top_p=0.9, seeds=[5, 6, 7, 8], length_of=[None, None, 0, None])
    return generate(lm.model, prompts, **{**args, **kw})


def _stops(lm, prompts):
    """The model's stop tokens and two tokens its free rollouts write early (random tiny models rarely end a
    turn): some rows stop, at different steps, others run to their budgets."""
    free = generate(lm.model, prompts, max_new_tokens=6, stop_ids=frozenset(), n=3, temperature=0.9, top_p=0.9,
                    seeds=[5, 6, 7, 8])
    return stop_token_ids(lm.tokenizer, lm.model) | {free[0][1].tokens[2], free[3][2].tokens[4]}


@pytest.mark.parametrize("name", TINY)
def test_checks_every_k_steps_equal_every_step(name):
    lm = get_model(name)
    prompts = prompts_for(lm, 4)
    every = _run(lm, prompts, check_every=1)
    assert len({r.stopped for rs in every for r in rs}) == 2
    for k in (3, 5):
        assert _run(lm, prompts, check_every=k) == every


@pytest.mark.parametrize("path", PATHS)
def test_every_decode_path(path, monkeypatch):
    lm = get_model("tiny-qwen2")
    prompts = prompts_for(lm, 4)
    kw = use_path(monkeypatch, path)
    assert _run(lm, prompts, check_every=4, **kw) == _run(lm, prompts, check_every=1, **kw)


def test_a_wide_nucleus_decodes_its_window_again(monkeypatch):
    lm = get_model("tiny-llama3")
    prompts = prompts_for(lm, 4)
    every = _run(lm, prompts, check_every=1)
    rewinds = []
    rewind = decode.Cascade.rewind
    monkeypatch.setattr(decode.Cascade, "rewind", lambda self, point: (rewinds.append(point[0]), rewind(self, point)))
    monkeypatch.setattr(sampling, "NUCLEUS_HEAD", 2)  # almost every nucleus is wider than the head
    assert _run(lm, prompts, check_every=4) == every
    assert rewinds


@pytest.mark.parametrize("static", [True, False])
def test_no_host_sync_between_checks(static):
    """Runs of 16 and 32 steps (no stops, one budget) with a check every 8 steps, with static shapes in a bucket
    (CUDA's default path) and dynamic ones: the extra 16 steps cost exactly their two checks' read-backs."""
    lm = get_model("tiny-olmo3")
    prompts = prompts_for(lm, 2)
    syncs = {}
    for steps in (16, 32):
        with HostCounter() as c:
            generate(lm.model, prompts, max_new_tokens=steps, stop_ids=frozenset(), n=2, greedy_first=True,
                     temperature=0.9, top_p=0.9, check_every=8, static_shapes=static)
        syncs[steps] = c.syncs
    kinds = ("to_host", "scalar_read", "data_shape")
    assert {k: syncs[32][k] - syncs[16][k] for k in kinds} == {"to_host": 2, "scalar_read": 0, "data_shape": 0}


@pytest.mark.parametrize("name", TINY)
def test_static_buckets_equal_dynamic(name, monkeypatch):
    """Static shapes: 12 rows run in the bucket of 16 and move down (8, 4, ...) as rows finish; the rollouts
    are the dynamic path's."""
    lm = get_model(name)
    prompts = prompts_for(lm, 4)
    dynamic = _run(lm, prompts, check_every=3, static_shapes=False)
    sizes = []
    keep = decode.Cascade.keep
    monkeypatch.setattr(decode.Cascade, "keep", lambda self, rows: (keep(self, rows), sizes.append(len(self.row_prompt))))
    assert _run(lm, prompts, check_every=3, static_shapes=True) == dynamic
    assert all(s in (1, 2, 4, 8) for s in sizes) and sizes == sorted(sizes, reverse=True)
    # Budgets alone (no stops): at the check after step 8 three rows are left (budget 11), bucket 4.
    free = dict(stop_ids=frozenset(), check_every=3)
    dynamic = _run(lm, prompts, static_shapes=False, **free)
    sizes.clear()
    assert _run(lm, prompts, static_shapes=True, **free) == dynamic
    assert sizes == [4]


def test_static_padding_keeps_the_prompt_grid_narrow():
    """A static batch's padding rows go to the prompts with the fewest rows, at the start and after compaction:
    the grid the prompt part is attended over stays as wide as the bucket needs (on an H200, padding every row to
    the last prompt made 576 rows of 64 prompts a grid 457 wide, and the step 7.5 times slower)."""
    lm = get_model("tiny-llama3")
    prompts = [lm.tokenizer.encode(f"Case {i}: which is right, A or B?") for i in range(9)]
    row_prompt = [p for p in range(9) for _ in range(3)]  # 27 rows: the bucket of 32, 5 padding rows
    state = decode.Cascade(lm.model, prompts, row_prompt, 4, pad_id=lm.pad_id, token_budget=4096, max_rows=64, static=True)
    assert len(state.row_prompt) == 32 and state.row_prompt[:27] == row_prompt and state.width == 4
    state.step()
    state.keep([r for r in range(27) if r % 3 != 2 and r < 21])  # 14 rows of 7 prompts: the bucket of 16
    assert len(state.row_prompt) == 16 and state.width == 3
    assert decode.padding_prompts([0, 0, 0, 1], 4) == [1, 1, 0, 1]


@pytest.mark.parametrize("name", TINY)
def test_static_own_buffers_that_double_equal_dynamic(name, monkeypatch):
    """A static batch's own buffers start at OWN_BLOCK tokens and double as the steps reach their end (2, 4, 8, then
    the budget of 11 here), through compaction across buckets and a window decoded again: the rollouts are the
    dynamic path's, and the buffers did grow."""
    lm = get_model(name)
    prompts = prompts_for(lm, 4)
    dynamic = _run(lm, prompts, check_every=3, static_shapes=False)
    monkeypatch.setattr(decode, "OWN_BLOCK", 2)
    spans = []
    grow = decode.Cascade._grow
    monkeypatch.setattr(decode.Cascade, "_grow", lambda self, span: (spans.append(span), grow(self, span)))
    assert _run(lm, prompts, check_every=3, static_shapes=True) == dynamic
    assert spans and spans == sorted(set(spans)) and spans[0] == 4
    free = dict(stop_ids=frozenset(), check_every=3)  # budgets alone: the longest row steps to its 11 tokens
    spans.clear()
    assert _run(lm, prompts, static_shapes=True, **free) == _run(lm, prompts, static_shapes=False, **free)
    assert spans == [4, 8, 11]
    monkeypatch.setattr(sampling, "NUCLEUS_HEAD", 2)  # windows decoded again after the buffers grew within them
    spans.clear()
    assert _run(lm, prompts, check_every=4, static_shapes=True) == dynamic and spans


def test_a_static_batch_steps_with_the_graphs_the_plan_counts(monkeypatch):
    """Rows that all run to one budget (no stops) are never compacted: the batch steps with one graph per own span,
    2, 4, 8 and 11 slots at OWN_BLOCK 2 and a budget of 11 (counted by hand), what `--plan` counts for it
    (engine.decode.graph_captures); a compaction to a smaller bucket adds one."""
    lm = get_model("tiny-llama3")
    prompts = prompts_for(lm, 4)
    monkeypatch.setattr(decode, "OWN_BLOCK", 2)
    states = []
    init = decode.Cascade.__init__
    monkeypatch.setattr(decode.Cascade, "__init__", lambda self, *a, **k: (init(self, *a, **k), states.append(self))[0])
    generate(lm.model, prompts, max_new_tokens=11, stop_ids=frozenset(), n=3, temperature=0.9, seeds=[1, 2, 3, 4],
             static_shapes=True, check_every=3)
    assert [s.graphs for s in states] == [4] == [decode.graph_captures(11)]
    states.clear()
    generate(lm.model, prompts, max_new_tokens=[11, 4, 4, 11], stop_ids=frozenset(), n=3, temperature=0.9,
             seeds=[1, 2, 3, 4], static_shapes=True, check_every=3)  # 6 of 12 rows end at 4: the bucket of 16 moves to 8
    assert [s.graphs for s in states] == [5]
    states.clear()  # the compaction at the check after step 4 and the growth to 8 slots come before one step: 1 graph
    generate(lm.model, prompts, max_new_tokens=[11, 4, 4, 11], stop_ids=frozenset(), n=3, temperature=0.9,
             seeds=[1, 2, 3, 4], static_shapes=True, check_every=4)
    assert [s.graphs for s in states] == [4]
    assert [decode.graph_captures(b) for b in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]


def test_own_spans():
    assert [decode.own_span(k, 300) for k in (0, 63, 64, 127, 128, 256, 299)] == [64, 64, 128, 128, 256, 300, 300]
    assert decode.own_span(0, 10) == 10 and decode.mean_own_span(10) == 10
    assert decode.mean_own_span(256) == (64 * 64 + 64 * 128 + 128 * 256) / 256
