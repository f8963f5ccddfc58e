"""Equality checks that only a GPU can make: on CUDA the static decode path captures each row-count bucket's step as
a CUDA graph and replays it, which CPU runs (tests/engine/test_steps.py) execute eagerly. On every tiny family,
in fp32 on the GPU, this checks against references computed without the code under test's fast paths:

- rollouts (greedy and sampled, stops, mixed budgets, a tied length, compaction across buckets, a check every 3
  steps) through the graph path equal the dynamic path's, and at least one graph was captured and replayed; and
  again with the rows' own buffers doubling from 2 tokens (a new graph at each doubling);
- greedy rollouts through the graph path equal a plain decoder (the whole sequence through the model for every
  token, no cache);
- letter masses read by the fast path (prefix trees, batching), and read after the anchor from the rows' own
  caches filled by the graph path, equal the plain one-prompt forward within 1e-5;
- between the host's checks the graph path reads nothing back from the device (two device-to-host copies for
  16 more steps with a check every 8);
- the draw over the whole vocabulary (top-p 1), block by block on the device, picks what one float64 running sum
  over each row picks, computed with numpy on the host;
- logits made NaN or infinite in one row at one step stop the graph path (NonFiniteLogitsError), the same NaN in a
  row past its end does not, and letters read from a NaN row on the device are refused.

    python scripts/gpu_equal.py --out $OUT/gpu_equal.json     # CUDA; --device cpu runs the same checks eagerly

Each check is run on its own; one that raises is recorded as failed with its error, and the others still run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import engine.decode as decode  # noqa: E402
from engine.anchor import anchor_read  # noqa: E402
from engine.generation import Rollout, generate, stop_token_ids  # noqa: E402
from engine.hostcount import HostCounter  # noqa: E402
from engine.loading import load_model  # noqa: E402
from engine.render import Prompt, encode_prompt, encode_raw  # noqa: E402
from engine.rowcache import RowCaches  # noqa: E402
from engine.scoring import score_ids  # noqa: E402
from engine.tiny import FAMILIES  # noqa: E402

TOLERANCE = 1e-5
QUESTIONS = ["Which is right, A or B? Explain, then end with Answer: <letter>.", "Say hello.",
             "Count to five, then explain why the sky is blue in some detail, please.", "Pick one: A) stay B) go C) wait"]


def prompts_for(lm):
    if lm.tokenizer.chat_template:
        return [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": q},))) for q in QUESTIONS]
    return [encode_raw(lm.tokenizer, q) for q in QUESTIONS]


def plain_greedy(model, ids, max_new, stop) -> Rollout:
    """Reference: one prompt, the whole sequence through the model for every token, argmax."""
    seq, out = list(ids), []
    device = model.get_input_embeddings().weight.device
    with torch.inference_mode():
        for _ in range(max_new):
            token = int(model(input_ids=torch.tensor([seq], device=device), use_cache=False).logits[0, -1].argmax())
            if token in stop:
                return Rollout(tuple(out), True, True)
            out.append(token)
            seq.append(token)
    return Rollout(tuple(out), False, True)


class Spy:
    """Counts graph captures and replays, and the bucket each compaction moves a static batch to."""

    def __init__(self):
        self.captures, self.replays, self.buckets = 0, 0, []

    def __enter__(self):
        self._capture, self._keep, self._step = decode.Cascade._capture, decode.Cascade.keep, decode.Cascade.step
        spy = self

        def capture(state):
            spy._capture(state)
            spy.captures += 1

        def keep(state, rows):
            spy._keep(state, rows)
            spy.buckets.append(len(state.row_prompt))

        def step(state, tokens=None):
            if getattr(state, "_graph", None) is not None:
                spy.replays += 1
            return spy._step(state, tokens)

        decode.Cascade._capture, decode.Cascade.keep, decode.Cascade.step = capture, keep, step
        return self

    def __exit__(self, *exc):
        decode.Cascade._capture, decode.Cascade.keep, decode.Cascade.step = self._capture, self._keep, self._step


def rollouts(lm, prompts, stops, **kw):
    args = dict(max_new_tokens=[11, 4, 9, 7], stop_ids=stops, n=3, greedy_first=True, temperature=0.9, top_p=0.9,
                seeds=[5, 6, 7, 8], length_of=[None, None, 0, None], check_every=3, pad_id=lm.pad_id)
    return generate(lm.model, prompts, **{**args, **kw})


def stops_for(lm, prompts):
    """The model's stop tokens and two tokens its rollouts write early (random tiny models rarely end a turn), so
    that some rows stop at different steps and the batch compacts down its buckets."""
    free = generate(lm.model, prompts, max_new_tokens=6, stop_ids=frozenset(), n=3, temperature=0.9, top_p=0.9,
                    seeds=[5, 6, 7, 8], static_shapes=False)
    return stop_token_ids(lm.tokenizer, lm.model) | {free[0][1].tokens[2], free[3][2].tokens[4]}


def check_graph_rollouts(lm, prompts, graphs_expected):
    stops = stops_for(lm, prompts)
    dynamic = rollouts(lm, prompts, stops, static_shapes=False)
    with Spy() as spy:
        static = rollouts(lm, prompts, stops, static_shapes=True)
    stopped = sorted({r.stopped for rs in static for r in rs})
    ok = static == dynamic and (spy.replays > 0 or not graphs_expected) and stopped == [False, True]
    return ok, dict(equal=static == dynamic, captures=spy.captures, replays=spy.replays, buckets=spy.buckets,
                    some_rows_stopped_others_not=stopped == [False, True])


def check_doubling_own_buffers(lm, prompts, graphs_expected):
    """The same rollouts with the own buffers starting at 2 tokens, so that they double (a new graph each time)
    within the budget of 11."""
    block = decode.OWN_BLOCK
    grow = decode.Cascade._grow
    spans = []
    decode.OWN_BLOCK = 2
    decode.Cascade._grow = lambda state, span: (spans.append(span), grow(state, span))[1]
    try:
        ok, detail = check_graph_rollouts(lm, prompts, graphs_expected)
    finally:
        decode.OWN_BLOCK, decode.Cascade._grow = block, grow
    return ok and bool(spans), dict(detail, own_buffer_spans=spans)


def check_greedy_plain(lm, prompts, graphs_expected):
    stop = stop_token_ids(lm.tokenizer, lm.model)
    ref = [plain_greedy(lm.model, p, 12, stop) for p in prompts]
    with Spy() as spy:
        out = generate(lm.model, prompts, max_new_tokens=12, stop_ids=stop, n=2, pad_id=lm.pad_id, static_shapes=True)
    equal = all(r == ref[i] for i, rs in enumerate(out) for r in rs)
    return equal and (spy.replays > 0 or not graphs_expected), dict(equal=equal, replays=spy.replays)


def reads_for(lm, prompts, outs):
    suffix = lm.tokenizer.encode("\nAnswer:", add_special_tokens=False)
    reads = []
    for p, rs in zip(prompts, outs):
        for r in rs:
            reads.append(anchor_read(lm.tokenizer, p, r).ids)
            k = max(1, len(r.tokens) // 2)
            reads.append(tuple(p) + r.tokens[:k] + tuple(suffix))
    return reads


def max_diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.mass, rb.mass))


def check_letters_and_rereads(lm, prompts, graphs_expected):
    store = RowCaches()
    with Spy() as spy:
        outs = generate(lm.model, prompts, max_new_tokens=[9, 5, 7, 6], stop_ids=stop_token_ids(lm.tokenizer, lm.model),
                        n=2, greedy_first=True, temperature=0.8, seeds=[1, 2, 3, 4], row_kv=store, static_shapes=True,
                        pad_id=lm.pad_id)
    reads = reads_for(lm, prompts, outs)
    letters = [lm.letters("AB")] * len(reads)
    plain = score_ids(lm.model, reads, letters, fast=False)
    fast = score_ids(lm.model, reads, letters, pad_id=lm.pad_id)
    cached = score_ids(lm.model, reads, letters, known_prefixes=store, pad_id=lm.pad_id)
    d_fast, d_cached = max_diff(plain, fast), max_diff(plain, cached)
    ok = d_fast < TOLERANCE and d_cached < TOLERANCE and store.rows_held > 0 and (spy.replays > 0 or not graphs_expected)
    return ok, dict(fast_vs_plain=d_fast, row_caches_vs_plain=d_cached, rows_held=store.rows_held, reads=len(reads))


def check_no_sync_between_checks(lm, prompts, graphs_expected):
    syncs = {}
    for steps in (16, 32):
        with HostCounter() as c:
            generate(lm.model, prompts[:2], max_new_tokens=steps, stop_ids=frozenset(), n=2, greedy_first=True,
                     temperature=0.9, top_p=0.9, check_every=8, static_shapes=True)
        syncs[steps] = c.syncs
    extra = {k: syncs[32][k] - syncs[16][k] for k in ("to_host", "scalar_read", "data_shape")}
    return extra == {"to_host": 2, "scalar_read": 0, "data_shape": 0}, dict(extra_syncs_for_16_steps=extra)


def check_draw_on_device(lm, prompts, graphs_expected):
    """The draw over the whole vocabulary (top-p 1), block by block on the device, picks what one float64 running sum
    over each row picks (numpy, on the host), at the family's vocabulary and at Llama-3's and OLMo-3's."""
    import numpy as np

    from engine.sampling import row_uniforms, sample_tokens

    device = lm.model.get_input_embeddings().weight.device
    mismatches, draws = 0, 0
    for vocab in (lm.model.config.vocab_size, 128256, 100278):
        gen = torch.Generator().manual_seed(vocab)
        logits = torch.cat([torch.randn(64, vocab, generator=gen) * scale for scale in (0.3, 3.0, 12.0)])
        logits[::3, 1::7] = float("-inf")  # masked tokens: weight 0, never drawn
        uniforms = row_uniforms(range(len(logits)), 1)[:, 0]
        logits = logits.to(device)
        picks = sample_tokens(logits, 0.7, 1.0, uniforms.to(device)).cpu().numpy()
        weights = (logits / 0.7).softmax(-1).double().cpu().numpy()  # the device's own weights, summed on the host
        cdfs = np.cumsum(weights, axis=-1)
        ref = [int(np.searchsorted(cdf, u * cdf[-1], side="right")) for cdf, u in zip(cdfs, uniforms.numpy())]
        mismatches += int((picks != np.array(ref)).sum())
        draws += len(ref)
    return mismatches == 0, dict(draws=draws, picks_unlike_the_running_sum=mismatches)


def check_non_finite_logits(lm, prompts, graphs_expected):
    """Logits made NaN, +inf or all -inf in one row at one step of the graph path stop it with NonFiniteLogitsError
    (the device's max propagates the NaN, its softmax turns an infinity into NaN), the same NaN in a row past its end
    leaves the rollouts as they were, and letters read from a NaN row on the device are refused."""
    from engine.errors import NonFiniteLogitsError
    from engine.scoring import letter_masses

    step = decode.Cascade.step
    spoils = {"nan": lambda row: row.index_fill_(0, torch.tensor([7], device=row.device), float("nan")),
              "inf": lambda row: row.index_fill_(0, torch.tensor([7], device=row.device), float("inf")),
              "all -inf": lambda row: row.fill_(float("-inf"))}

    def run(spoil=None, at=None):
        def poisoned(state, tokens=None):
            at_step = state.step_index
            logits = step(state, tokens)
            if spoil is not None and at_step == at:
                logits = logits.clone()
                rows = [r for r, k in enumerate(state.row_prompt[: logits.shape[0]]) if state.prompts[k] == list(prompts[0])]
                spoil(logits[rows[1]])  # the first prompt's rollout 1 (a budget of 2: it chooses at steps 0 and 1)
            return logits
        decode.Cascade.step = poisoned
        try:
            return generate(lm.model, prompts[:3], max_new_tokens=[2, 8, 8], stop_ids=frozenset(), n=2, temperature=0.7,
                            seeds=[3, 4, 5], compact=False, check_every=3, static_shapes=True, pad_id=lm.pad_id)
        except NonFiniteLogitsError:
            return "stopped"
        finally:
            decode.Cascade.step = step

    clean = run()
    stopped = {kind: run(spoil, at=1) == "stopped" for kind, spoil in spoils.items()}
    past_end_kept = run(spoils["nan"], at=2) == clean
    logits = torch.zeros(2, lm.model.config.vocab_size, device=lm.model.get_input_embeddings().weight.device)
    logits[1, 5] = float("nan")
    try:
        letter_masses(logits, [lm.letters("AB")] * 2, [4, 4], 1.0, 1.0)
        letters_refused = False
    except NonFiniteLogitsError:
        letters_refused = True
    ok = all(stopped.values()) and past_end_kept and letters_refused
    return ok, dict(stopped=stopped, nan_past_the_end_kept_the_rollouts=past_end_kept, nan_letters_refused=letters_refused)


CHECKS = {"graph_rollouts_equal_dynamic": check_graph_rollouts, "graph_greedy_equals_plain_decoder": check_greedy_plain,
          "graph_rollouts_with_doubling_own_buffers": check_doubling_own_buffers,
          "letters_and_row_cache_rereads_equal_plain": check_letters_and_rereads,
          "no_host_sync_between_checks": check_no_sync_between_checks, "draw_on_device_equals_running_sum": check_draw_on_device,
          "non_finite_logits_stop_on_device": check_non_finite_logits}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--families", default=",".join(sorted(FAMILIES)))
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    a = ap.parse_args()
    graphs_expected = a.device.startswith("cuda") and decode.CUDA_GRAPHS
    results = []

    def save(complete: bool = False):  # after every check: a run stopped by its time limit keeps the checks done
        if a.out:
            tmp = Path(a.out).with_suffix(".tmp")
            tmp.write_text(json.dumps(dict(device=a.device, torch=torch.__version__, complete=complete, results=results),
                                      indent=2) + "\n")
            tmp.replace(a.out)

    for name in a.families.split(","):
        lm = load_model(name, device=a.device, dtype=torch.float32)
        prompts = prompts_for(lm)
        for check, fn in CHECKS.items():
            t0 = time.perf_counter()
            try:
                ok, detail = fn(lm, prompts, graphs_expected)
            except Exception as exc:  # recorded; the other checks still run
                ok, detail = False, dict(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
            results.append(dict(family=name, check=check, ok=bool(ok), seconds=time.perf_counter() - t0, **detail))
            save()
            shown = {k: v for k, v in detail.items() if k != "traceback"}
            print(f"{'PASS' if ok else 'FAIL'}  {name:12s} {check:42s} {shown}", flush=True)
        del lm
    passed = sum(r["ok"] for r in results)
    print(f"gpu_equal on {a.device} ({torch.cuda.get_device_name() if a.device.startswith('cuda') else 'cpu'}): "
          f"{passed} of {len(results)} checks passed")
    save(complete=True)
    sys.exit(0 if passed == len(results) else 1)


if __name__ == "__main__":
    main()
