"""The decoding loop of one generation batch: every row (prompt x rollout) steps together, choosing its next
token on the device (argmax, or a draw from the tempered top-p nucleus at its own counter-based uniform).

The host looks at the batch only at checks, every `check_every` steps and at the last one: between checks no
step reads anything back (the end of a row is recorded on the device, the draw's nucleus test too), so on an
accelerator the steps queue without waiting. At a check the host reads, in one copy, which rows ended and at
which step, then compacts finished rows out once COMPACT_FRACTION of the rows have finished, and stops when
all have. A row that ended between checks keeps stepping until the check; what it generates past its end is
never kept, so the rollouts are those of checking every step (`check_every=1`).

The draw looks at the NUCLEUS_HEAD most likely tokens (engine/sampling.py). Where a row's nucleus was wider
at some step of a window, which the check learns from the device flag, the window is decoded again from the
check before it with the widening draw (the decode state rewinds: the own slots it writes are written again),
so the tokens are the widening draw's in every case.

Logits that are NaN or infinite at a step where a row chooses its token (a NaN anywhere in the row, an infinity, or
every token at -inf; a tied row's stop tokens are masked to -inf before) stop the batch at the next check with
NonFiniteLogitsError: the device keeps the sum of each row's largest logit, which is finite until then, and the check
reads whether it still is with the rest.
"""

from __future__ import annotations

import torch

from engine.decode import bucket
from engine.errors import NonFiniteLogitsError
from engine.sampling import derive_seed, row_uniforms, sample_tokens, sample_tokens_unchecked

COMPACT_FRACTION = 1 / 8
"""Finished rows are dropped from the batch (compaction) once at least this share of its rows, and at least
one, has finished: the copy of the remaining rows' buffers is then paid back by the steps that follow."""


class _Rows:
    """The device tensors of the rows in the batch (one entry per batch row), indexed together at compaction."""

    def __init__(self, **tensors):
        self.__dict__.update(tensors)

    def keep(self, idx: torch.Tensor) -> None:
        for name, t in list(self.__dict__.items()):
            self.__dict__[name] = t[idx]

    def snapshot(self) -> dict:
        return {name: t.clone() for name, t in self.__dict__.items()}

    def restore(self, saved: dict) -> None:
        self.__dict__.update({name: t.clone() for name, t in saved.items()})


def decode_batch(state, prompts, seeds, budgets, settings, leaders, check_every: int):
    """Decode one batch on `state` (engine/decode.py); returns (tokens [rows, max_new] on the host, lengths,
    stopped, greedy, rows' own keys/values for settings.row_kv {row: layers})."""
    n, temperature, device = settings.n, settings.temperature, settings.device
    rows = len(prompts) * n
    lead = [-1 if leaders[r // n] is None else leaders[r // n] * n + r % n for r in range(rows)]  # a row's leader row
    tied = any(x >= 0 for x in lead)
    greedy = [temperature == 0 or (settings.greedy_first and r % n == 0) for r in range(rows)]
    max_new = max(budgets)
    uniforms = torch.zeros((rows, max_new), dtype=torch.float64)
    sampled = [r for r in range(rows) if not greedy[r]]
    if sampled:
        uniforms[sampled] = row_uniforms([derive_seed(seeds[r // n], r % n) for r in sampled], max_new)
    live = list(range(rows))  # the original row of each row in the batch
    b = _Rows(live=torch.arange(rows, device=device), greedy=torch.tensor(greedy, device=device),
              budget=torch.tensor([budgets[r // n] for r in range(rows)], device=device), uniforms=uniforms.to(device),
              done=torch.zeros(rows, dtype=torch.bool, device=device),
              end_at=torch.full((rows,), -1, dtype=torch.long, device=device),
              hit=torch.zeros(rows, dtype=torch.bool, device=device),
              tied=torch.tensor([x >= 0 for x in lead], device=device),
              # the sum of the row's largest logit over the steps it chose a token at: not finite once some such
              # step's logits held a NaN or an infinity, or were all -inf (nothing to choose from)
              top_sum=torch.zeros(rows, dtype=torch.float64, device=device),
              lead_at=torch.tensor([max(x, 0) for x in lead], device=device))  # the leader's position among live rows
    stop = torch.tensor(sorted(settings.stop_ids), device=device) if settings.stop_ids else None
    tokens = torch.zeros((rows, max_new), dtype=torch.long, device=device)
    lengths, stopped, ended_at = [0] * rows, [False] * rows, {}
    can_rewind = hasattr(state, "rewind")
    logits = state.step()
    # Each prompt's keys/values, whole once the first step has run and before compaction drops any prompt's rows
    # (copies: the buffers they come from are reused).
    prompt_kv = state.prompt_kv() if settings.prefix_kv is not None else None
    stop_cols = stop[stop < logits.shape[-1]] if tied and stop is not None else None
    rows_kv, room = {}, _room(settings.row_kv)  # finished rows' own keys/values
    start, saved = 0, None  # the window since the last check, and the state at its start
    exact_until = -1  # steps up to this one draw with the widening sampler (a window decoded again)
    wide = torch.zeros((), dtype=torch.bool, device=device)
    step = 0
    while True:
        if saved is None and can_rewind and not all(greedy[r] for r in live):
            saved = (state.rewind_point(), b.snapshot(), logits.clone())
        if stop_cols is not None:  # a tied row may not end its turn: its length is its leader's
            logits[:, stop_cols] = logits[:, stop_cols].masked_fill(b.tied[:, None], float("-inf"))
        top, best = logits.max(-1)  # `best` is argmax's pick (the first largest); `top` is NaN where the row holds one
        b.top_sum += top.masked_fill(b.done, 0.0)  # a row past its end chooses nothing: its logits are never used
        if all(greedy[r] for r in live):
            token = best
        elif step <= exact_until or not can_rewind:
            token = torch.where(b.greedy, best, sample_tokens(logits, temperature, settings.top_p, b.uniforms[:, step]))
        else:
            drawn, covered = sample_tokens_unchecked(logits, temperature, settings.top_p, b.uniforms[:, step])
            token = torch.where(b.greedy, best, drawn)
            wide = wide | (~covered & ~b.greedy).any()
        tokens[b.live, step] = token
        hit_stop = torch.isin(token, stop) if stop is not None else torch.zeros_like(b.done)
        ends = (hit_stop | (b.budget <= step + 1)) & ~b.done
        if tied:  # a tied row ends with its leader (a leader is never tied, so its own `ends` is final)
            ends |= b.tied & ends[b.lead_at] & ~b.done
        b.end_at = torch.where(ends, step, b.end_at)
        b.hit |= ends & hit_stop
        b.done |= ends
        last = step == max_new - 1
        if last or step + 1 - start >= check_every:
            # The check: the one read-back of the window.
            news = torch.cat([b.end_at, b.hit.long(), wide.long()[None], (~b.top_sum.isfinite()).any().long()[None]]).tolist()
            if news[-1]:  # some row chose a token from logits that were not finite: nothing of this batch is kept
                _non_finite(b.top_sum, live, prompts, n, start, step)
            if news[-2]:  # some nucleus was wider than the head: decode the window again, widening
                state.rewind(saved[0])
                b.restore(saved[1])
                logits, exact_until, step = saved[2].clone(), step, start
                wide = torch.zeros_like(wide)
                continue
            end_at, hit = news[: len(live)], news[len(live) : 2 * len(live)]
            now = {}
            for c, r in enumerate(live):
                if end_at[c] >= start and r not in ended_at:
                    s = end_at[c]
                    stopped[r], lengths[r], ended_at[r], now[r] = bool(hit[c]), s if hit[c] else s + 1, s, s
            for r, s in now.items():
                if lead[r] >= 0 and ended_at.get(lead[r]) == s:  # ended with its leader: as many tokens as it kept
                    stopped[r], lengths[r] = False, min(s + 1, lengths[lead[r]])
            finished = sum(1 for r in live if r in ended_at)
            if finished == len(live) or last:
                break
            keep = [c for c, r in enumerate(live) if r not in ended_at]
            # A static batch moves only down to a smaller bucket (its shapes stay those of its bucket).
            if (settings.compact and now and finished >= max(1.0, COMPACT_FRACTION * len(live))
                    and (not settings.static or bucket(len(keep)) < bucket(len(live)))):
                if settings.row_kv is not None:  # the rows leaving take their caches with them
                    room = _hold_rows(state, rows_kv, room, live, lengths, [c for c, r in enumerate(live) if r in ended_at])
                idx = torch.tensor(keep, device=device)
                state.keep(keep)
                b.keep(idx)
                token = token[idx]
                live = [live[c] for c in keep]
                if tied:
                    at = {r: c for c, r in enumerate(live)}
                    b.lead_at = torch.tensor([at.get(lead[r], 0) for r in live], device=device)
            start, saved = step + 1, None
        logits = state.step(token)
        step += 1
    if settings.row_kv is not None:
        _hold_rows(state, rows_kv, room, live, lengths, range(len(live)))
    return tokens.cpu(), lengths, stopped, greedy, rows_kv, prompt_kv


def _non_finite(top_sum: torch.Tensor, live, prompts, n: int, start: int, step: int):
    """Raise NonFiniteLogitsError for the rows whose `top_sum` is not finite, in the window of steps start..step."""
    bad = (~top_sum.isfinite()).nonzero()[:, 0].tolist()
    r = live[bad[0]]
    raise NonFiniteLogitsError(
        f"decoding: the model's next-token logits were NaN or infinite for {len(bad)} of {len(live)} rows at a step "
        f"between {start} and {step} (first: rollout {r % n} of a prompt of {len(prompts[r // n])} tokens); its weights, "
        f"or a dtype too narrow for its activations, put them out of range")


def _room(store) -> int:
    return 0 if store is None else max(0, store.limit_bytes - store.held_bytes)


def _hold_rows(state, rows_kv: dict, room: int, live, lengths, batch_rows) -> int:
    """Copy the own keys/values of the finished batch rows `batch_rows` (while the room lasts); returns the room
    left. A row holds the generated tokens the steps fed, at most its kept length."""
    per_token = sum(2 * k.shape[1] * k.shape[3] * k.element_size() for k in state.ks)
    for c in batch_rows:
        m = min(lengths[live[c]], state.step_index - 1)
        if m > 0 and m * per_token <= room:
            rows_kv[live[c]] = state.row_kv(c, m)
            room -= m * per_token
    return room
