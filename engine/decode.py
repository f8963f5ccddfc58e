"""Decode state for generation: what one batch's rows attend to, and the forward pass of one decoding step.

The cascade backend (every architecture whose attention goes through transformers' attention interface
with plain softmax attention: the Llama, Qwen, OLMo and Mistral families) keeps each distinct prompt's
keys/values once, computed by the scoring prefix tree (prompts sharing a prefix run it once), and each row
(one rollout) its own generated keys/values in a buffer written in place. A decoding step
is the model's own forward pass with a registered attention function that writes the new token's keys and
values in place and attends to the prompt part grouped by prompt (one matrix product per prompt for all its
rows: the prompt's keys are read once, not once per rollout) and to the row's own part, merging the two
softmax parts exactly. Finished rows are dropped by compacting the row buffers; prompts whose rows have all
finished are dropped with them. With `static=True` every tensor a step touches keeps its shape and address
from one step to the next (the own part read over its whole buffer under a mask, the step counter a device
tensor): the forward pass is then fit for CUDA graphs or torch.compile, and on CUDA it is captured in a CUDA graph
after the first step. Its own buffer starts at OWN_BLOCK tokens and doubles, up to the budget, when the steps reach
its end (a new graph each time); compaction moves it down to a smaller row bucket (a new graph too).

The dense backend (engine/dense_decode.py) is the fallback for any other architecture: the model's own attention
and cache, prompts left-padded, the prefill cache repeated for each rollout and grown by the model each step.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import warnings
from typing import Sequence

import torch

from engine.batching import is_out_of_memory, spread_over_devices
from engine.prefill import prefill_prompts
from engine.scoring import ScoreStats

ATTENTION = "logit_readout_cascade"
"""Name of the cascade attention function in transformers' attention interface."""

CASCADE_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "olmo", "olmo2", "olmo3", "mistral", "smollm3"})
"""Architectures whose attention is plain scaled softmax attention over rotary keys through the attention
interface (no soft-capping, sinks or position biases): the cascade backend decodes them exactly."""

log = logging.getLogger(__name__)
_registered = False
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
CUDA_GRAPHS = True
"""Static-shape decoding on CUDA replays its step as a CUDA graph (False: the same static steps, eager)."""
USE_FLASH_CPU = True
"""Decode on CPU through the flash kernel where it applies (False: the explicit attention everywhere; for checks)."""


def bucket(rows: int) -> int:
    """The row count a static batch of `rows` rows runs at: the next power of two (one CUDA graph per bucket)."""
    return 1 << max(0, rows - 1).bit_length()


def padding_prompts(row_prompt: Sequence[int], pad: int) -> list[int]:
    """The prompts of `pad` padding rows for a static batch whose rows read `row_prompt`: each to a prompt with the
    fewest rows so far, so that the prompt-grouped grid (as wide as the most rows any prompt has) stays as narrow
    as the bucket allows. Padding every row to one prompt would widen it to that prompt's rows plus all the padding:
    576 rows of 64 prompts in the bucket of 1,024 made a grid of 64 x 457 slots instead of 64 x 16 (measured on an
    H200: the step 7.5 times slower than the dynamic path's)."""
    counts: dict[int, int] = {}
    for p in row_prompt:
        counts[p] = counts.get(p, 0) + 1
    heap = [(c, p) for p, c in counts.items()]
    heapq.heapify(heap)
    out = []
    for _ in range(pad):
        c, p = heapq.heappop(heap)
        out.append(p)
        heapq.heappush(heap, (c + 1, p))
    return out


OWN_BLOCK = 64
"""Tokens a static batch's own buffers hold at first; they double when the steps reach their end, up to the budget.
A static step reads every slot of its buffer under a mask: with the whole budget from the first step, a batch
stepped to its budget read on average 2x the slots its steps had written, and held the whole budget all along;
doubling reads 1.34x (512-token budgets; 1.33x at 2,048) for log2(budget / OWN_BLOCK) more graph captures."""


def own_span(step_index: int, budget: int) -> int:
    """The own buffer's length (in tokens) a static batch steps with at step `step_index` (0: the first step)."""
    span = OWN_BLOCK
    while span <= step_index:
        span *= 2
    return min(span, budget)


def graph_captures(budget: int) -> int:
    """The graphs a static batch stepped to its budget without compaction steps with (on CUDA, captures): one per own
    buffer span (`own_span`), ceil(log2(budget / OWN_BLOCK)) + 1 of them (1 up to OWN_BLOCK); a compaction to a
    smaller bucket adds one (`Cascade.graphs` counts a batch's). `--plan` costs them."""
    count, span = 1, OWN_BLOCK
    while span < budget:
        count, span = count + 1, span * 2
    return count


def mean_own_span(budget: int) -> float:
    """The own slots a static step reads on average over a batch stepped to its budget (`--plan` counts them)."""
    return sum(own_span(k, budget) for k in range(budget)) / budget


def cascade_config(cfg) -> bool:
    """Whether a model of this config can decode on the cascade backend (its family, no logit soft-capping);
    `--plan` reads it from the config alone."""
    capped = any(getattr(cfg, a, None) not in (None, 1.0) for a in ("attn_logit_softcapping", "final_logit_softcapping"))
    return cfg.model_type in CASCADE_MODEL_TYPES and not capped


def supports_cascade(model) -> bool:
    """Whether the cascade backend decodes this model (otherwise the dense fallback does)."""
    can_set = getattr(model, "_can_set_attn_implementation", lambda: True)()
    # Its caches and masks live on one device; a model spread over several (device_map) uses the fallback.
    return cascade_config(model.config) and can_set and not spread_over_devices(model)


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(ATTENTION, _cascade_attention)
        _registered = True


@contextlib.contextmanager
def _cascade_attention_on(model):
    """The model's attention goes through the cascade function for the duration (restored after, also on errors).
    Its name has no mask function registered, so the model builds no attention mask either."""
    _register()
    cfg = model.config
    before = cfg._attn_implementation
    cfg._attn_implementation = ATTENTION
    try:
        yield
    finally:
        cfg._attn_implementation = before


def _cascade_attention(module, query, key, value, attention_mask, scaling=None, sliding_window=None, **kwargs):
    """Attention of one decoding step (one query token per row) over the row's prompt and its own tokens."""
    state: Cascade | None = kwargs.get("readout_decode")
    if state is None:
        raise RuntimeError(f"attention '{ATTENTION}' runs only inside engine.decode's decoding steps")
    return state.attend(module.layer_idx, query, key, value, scaling, sliding_window), None


class Cascade:
    """Keys/values of one batch being decoded: per distinct prompt, the prompt minus its last token (shared by
    that prompt's rows); per row, its own tokens (the prompt's last token, then the generated ones).

    Rows are given as the distinct prompt each reads (`row_prompt`; in any order, though prompt-major rows
    need no gathers). The first step feeds every row its prompt's last token, whose logits give the first
    generated token.
    """

    def __init__(self, model, prompts: Sequence[Sequence[int]], row_prompt: Sequence[int], budget: int, *, pad_id: int,
                 token_budget: int, max_rows: int, static: bool = False, share_prefixes: bool = True):
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.static = static
        self.budget = budget
        self.prompts = [list(p) for p in prompts]
        self.lengths = torch.tensor([len(p) for p in self.prompts], device=self.device)
        heads = [p[:-1] for p in self.prompts]
        self.prefill_stats = ScoreStats()
        self.kp, self.vp = prefill_prompts(model, heads, pad_id, self.device, token_budget, max_rows, share_prefixes, self.prefill_stats)
        longest = self.kp[0].shape[2] if self.kp else 0
        # Keys a prompt does not have (shorter prompts, padded to the longest) never get weight.
        valid = torch.arange(longest, device=self.device)[None, :] < (self.lengths[:, None] - 1)
        self.prompt_bias = torch.zeros(valid.shape, device=self.device).masked_fill_(~valid, float("-inf"))[:, None, None, :]
        self.rows = len(row_prompt)  # the batch's rows; a static batch pads them to its bucket with copies
        self.row_prompt = list(row_prompt) + (padding_prompts(row_prompt, bucket(len(row_prompt)) - len(row_prompt)) if static else [])
        self.reach = int(self.lengths.max()) + budget  # beyond the last position any row reaches
        self.fused = (USE_FLASH_CPU and _FLASH_CPU is not None and self.device.type == "cpu" and bool(self.kp)
                      and min(len(p) for p in self.prompts) > 1)
        # Each row's own keys/values, written in place: the whole budget at once, or (static) OWN_BLOCK tokens that double.
        cfg = model.config
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        dtype = model.get_input_embeddings().weight.dtype
        shape = (len(self.row_prompt), kv_heads, own_span(0, budget) if static else budget, head_dim)
        self.ks = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]
        self.vs = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.num_hidden_layers)]
        self.step_index = 0
        self._grid()
        self.tokens = torch.tensor([self.prompts[p][-1] for p in self.row_prompt], device=self.device)
        self.positions = self.lengths[torch.tensor(self.row_prompt, device=self.device)] - 1
        if static:
            self.step_t = torch.zeros(1, dtype=torch.long, device=self.device)
            self._slots(shape[2])
            self._graph = None
            self.graphs = 0  # the graphs its steps have needed (captured on CUDA): one per bucket and own span stepped
            self._fresh = True  # the next step starts a graph
            self.graph_used = False  # True once a graph is captured; False again if one fails (the steps run eagerly)
            self.graph_error: str | None = None

    # -- layout --------------------------------------------------------------------------------------
    def _grid(self) -> None:
        """Where each row sits when rows are grouped by prompt: a [P, c] grid, c the most rows any prompt has."""
        counts: dict[int, int] = {}
        for p in self.row_prompt:
            counts[p] = counts.get(p, 0) + 1
        self.width = max(counts.values())
        grid = [len(self.row_prompt)] * (len(self.prompts) * self.width)
        seen: dict[int, int] = {}
        slot = []
        for p in self.row_prompt:
            slot.append(p * self.width + seen.get(p, 0))
            seen[p] = seen.get(p, 0) + 1
        for r, k in enumerate(slot):
            grid[k] = r
        # Rows already in grid order (no compaction yet, prompt-major): views, no gathers.
        self.identity_grid = len(grid) == len(self.row_prompt) and grid == list(range(len(grid)))
        self.grid_rows = torch.tensor(grid, device=self.device)
        self.row_slot = torch.tensor(slot, device=self.device)

    def _to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """Row tensor [R, Hkv, g, F] -> grouped by prompt [P, Hkv, c*g, F] (empty grid slots hold zeros)."""
        rows, kv_heads, g, f = x.shape
        if not self.identity_grid:
            x = torch.cat([x, x.new_zeros((1, kv_heads, g, f))])[self.grid_rows]
        return x.view(len(self.prompts), -1, kv_heads, g, f).transpose(1, 2).reshape(len(self.prompts), kv_heads, -1, f)

    def _from_grid(self, y: torch.Tensor, g: int) -> torch.Tensor:
        """Inverse of `_to_grid` for the rows that exist: [P, Hkv, c*g, F] -> [R, Hkv, g, F]."""
        prompts, kv_heads, _, f = y.shape
        y = y.view(prompts, kv_heads, -1, g, f).transpose(1, 2).reshape(-1, kv_heads, g, f)
        return y if self.identity_grid else y[self.row_slot]

    def keep(self, rows: Sequence[int]) -> None:
        """Drop every row not in `rows` (indices of the current rows, ascending), and the prompts left without rows."""
        rows = list(rows)
        self.rows = len(rows)
        if self.static:  # down to the bucket that holds the rows, padded with copies of rows; a new graph
            first: dict[int, int] = {}
            for r in rows:
                first.setdefault(self.row_prompt[r], r)
            rows = rows + [first[p] for p in padding_prompts([self.row_prompt[r] for r in rows], bucket(len(rows)) - len(rows))]
            self._graph, self._fresh = None, True
        idx = torch.tensor(rows, device=self.device)
        used = self.step_index
        for buffers in (self.ks, self.vs):
            for i, old in enumerate(buffers):
                # A static step reads every slot under a mask: unwritten ones must hold numbers, not garbage.
                new = (old.new_zeros if self.static else old.new_empty)((len(rows),) + old.shape[1:])
                new[:, :, :used] = old[idx, :, :used]
                buffers[i] = new
        self.tokens, self.positions = self.tokens[idx], self.positions[idx]
        row_prompt = [self.row_prompt[r] for r in rows]
        alive = sorted(set(row_prompt))
        if len(alive) < len(self.prompts):
            pidx = torch.tensor(alive, device=self.device)
            self.kp = [k[pidx] for k in self.kp]
            self.vp = [v[pidx] for v in self.vp]
            self.prompt_bias, self.lengths = self.prompt_bias[pidx], self.lengths[pidx]
            self.prompts = [self.prompts[p] for p in alive]
            renumber = {p: i for i, p in enumerate(alive)}
            row_prompt = [renumber[p] for p in row_prompt]
        self.row_prompt = row_prompt
        self._grid()

    def prompt_kv(self) -> dict:
        """Each prompt's keys/values ({prompt tuple: [(keys, values) per layer]}, [1, heads, len, dim]), for
        reading letters after the generated text; valid once the first step has run (it computes the last token's)."""
        first = {}
        for r, p in enumerate(self.row_prompt):
            first.setdefault(p, r)
        out = {}
        for p, r in first.items():
            n = len(self.prompts[p]) - 1
            out[tuple(self.prompts[p])] = [
                tuple(torch.cat([part[p : p + 1, :, :n], own[r : r + 1, :, :1]], dim=2)
                      for part, own in ((self.kp[i], self.ks[i]), (self.vp[i], self.vs[i])))
                if self.kp else (self.ks[i][r : r + 1, :, :1].clone(), self.vs[i][r : r + 1, :, :1].clone())
                for i in range(len(self.ks))
            ]
        return out

    def row_kv(self, row: int, m: int) -> list:
        """Row `row`'s keys/values of its first `m` generated tokens ([(keys, values) per layer], [1, Hkv, m, D],
        copies); valid for tokens the steps have fed (own slot j + 1 holds generated token j)."""
        if m + 1 > self.step_index:
            raise ValueError(f"row {row}: {m} generated tokens asked, {self.step_index - 1} fed")
        return [(k[row : row + 1, :, 1 : 1 + m].clone(), v[row : row + 1, :, 1 : 1 + m].clone())
                for k, v in zip(self.ks, self.vs)]

    def rewind_point(self):
        """What `rewind` needs to step again from here (the rows and prompts must be the same then)."""
        return self.step_index, self.positions.clone(), self.tokens.clone()

    def rewind(self, point) -> None:
        """Back to a `rewind_point`: the next steps feed the same positions again and rewrite the own slots."""
        self.step_index, positions, tokens = point
        self.positions, self.tokens = positions.clone(), tokens.clone()
        if self.static:
            self.step_t.fill_(max(self.step_index - 1, 0))

    # -- one step --------------------------------------------------------------------------------------
    def step(self, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """Run one decoding step: feed `tokens` [R] (None: the prompts' last tokens, the first step) at each
        row's next position; returns the next-token logits [R, V] (fp32)."""
        if tokens is not None:
            self.positions = self.positions + 1
            pad = len(self.row_prompt) - tokens.shape[0]
            self.tokens = torch.cat([tokens, tokens[-1:].expand(pad)]) if pad else tokens
        if not self.static:
            logits = self._forward()
            self.step_index += 1
            return logits
        if self.step_index:  # static buffers are updated in place: the same addresses every step
            self.step_t.add_(1)
        if self.step_index >= self.ks[0].shape[2]:  # the steps reached the own buffer's end: double it, a new graph
            self._grow(own_span(self.step_index, self.budget))
        if self._fresh:  # a compaction and a growth before one step start one graph, not two
            self.graphs, self._fresh = self.graphs + 1, False
        self.own_bias.copy_(torch.where(self.slots <= self.step_t, 0.0, float("-inf"))[None, None, None, :])
        if self._graph is not None:
            self._tokens_in.copy_(self.tokens)
            self._positions_in.copy_(self.positions)
            self._graph.replay()
            logits = self._logits_out.clone()
        else:  # the first step of a bucket runs eagerly, then its graph is captured
            logits = self._forward()
            if self.device.type == "cuda" and self.graph_error is None and CUDA_GRAPHS:
                try:
                    self._capture()
                except RuntimeError as exc:  # an op the graph cannot hold: the same static steps, run eagerly
                    if is_out_of_memory(exc):  # the batch does not fit: engine.batching.halving_on_oom halves it
                        raise
                    self._graph, self.graph_used, self.graph_error = None, False, f"{type(exc).__name__}: {exc}"
                    log.warning("static decoding runs without a CUDA graph: %s", self.graph_error)
                    warnings.warn(f"static decoding runs without a CUDA graph: {self.graph_error}", stacklevel=2)
        self.step_index += 1
        return logits[: self.rows] if self.rows < logits.shape[0] else logits

    def _slots(self, span: int) -> None:
        self.slots = torch.arange(span, device=self.device)
        self.own_bias = torch.zeros((1, 1, 1, span), device=self.device)

    def _grow(self, span: int) -> None:
        """A static batch's own buffers to `span` tokens, what the steps wrote kept (unwritten slots hold zeros)."""
        for buffers in (self.ks, self.vs):
            for i, old in enumerate(buffers):
                new = old.new_zeros(old.shape[:2] + (span,) + old.shape[3:])
                new[:, :, : old.shape[2]] = old
                buffers[i] = new
        self._slots(span)
        self._graph, self._fresh = None, True

    def _forward(self, tokens=None, positions=None) -> torch.Tensor:
        tokens = self.tokens if tokens is None else tokens
        positions = self.positions if positions is None else positions
        with _cascade_attention_on(self.model):
            out = self.model(input_ids=tokens[:, None], position_ids=positions[:, None], use_cache=False,
                             logits_to_keep=1, readout_decode=self)
        return out.logits[:, -1].float()

    def _capture(self) -> None:
        """Record the static step's forward pass as a CUDA graph (replayed by later steps). Replays rewrite the
        same cache slot the eager step just wrote, with the same values, so warming up is harmless. The model's
        device is made current (torch.cuda.graph synchronizes, frees cached blocks and begins the capture on the
        current device) and the capture stream is passed (its default is made once, on the device current then)."""
        self._tokens_in = self.tokens.clone()
        self._positions_in = self.positions.clone()
        with torch.cuda.device(self.device):
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self._forward(self._tokens_in, self._positions_in)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                self._logits_out = self._forward(self._tokens_in, self._positions_in)
        self._graph = graph
        self.graph_used = True

    def attend(self, layer: int, query, key, value, scaling, sliding_window):
        """Attention for one layer: store the step's key/value in the row's buffer, attend to prompt and own parts."""
        rows, heads, _, dim = query.shape
        kv_heads = key.shape[1]
        g = heads // kv_heads
        scale = scaling if scaling is not None else dim**-0.5
        ks, vs = self.ks[layer], self.vs[layer]
        if self.static:
            ks.index_copy_(2, self.step_t, key)
            vs.index_copy_(2, self.step_t, value)
            own_bias = self.own_bias
        else:
            t = self.step_index
            ks[:, :, t] = key[:, :, 0]
            vs[:, :, t] = value[:, :, 0]
            ks, vs, own_bias = ks[:, :, : t + 1], vs[:, :, : t + 1], None
        q = query.reshape(rows, kv_heads, g, dim)
        windowed = sliding_window is not None and self.reach > sliding_window  # some key can fall out of the window
        if self.fused and not windowed:
            return self._attend_fused(q, ks, vs, own_bias, layer, scale).to(query.dtype).reshape(rows, 1, heads, -1)
        own = torch.matmul(q, ks.transpose(-1, -2)).float() * scale  # [R, Hkv, g, S]
        if own_bias is not None:
            own = own + own_bias
        if windowed:  # own slot s of a row at step t is t - s positions back
            step = self.step_t if self.static else torch.tensor(self.step_index, device=self.device)
            slots = torch.arange(own.shape[-1], device=self.device)
            own = own.masked_fill((step - slots >= sliding_window)[None, None, None, :], float("-inf"))
        top = own.amax(-1, keepdim=True)
        if self.kp:
            qg = self._to_grid(q)
            part = torch.matmul(qg, self.kp[layer].transpose(-1, -2)).float() * scale + self.prompt_bias
            if windowed:  # prompt key j of a prompt at position pos is pos - j back
                pos = self.lengths - 1 + (self.step_t if self.static else self.step_index)
                far = pos[:, None] - torch.arange(part.shape[-1], device=self.device)[None, :] >= sliding_window
                part = part.masked_fill(far[:, None, None, :], float("-inf"))
            top = torch.maximum(top, self._from_grid(part.amax(-1, keepdim=True), g))
            weights = (part - self._to_grid(top)).exp()
            out = self._from_grid(torch.matmul(weights.to(value.dtype), self.vp[layer]).float(), g)
            total = self._from_grid(weights.sum(-1, keepdim=True), g)
        else:
            out, total = 0.0, 0.0
        weights = (own - top).exp()
        out = out + torch.matmul(weights.to(value.dtype), vs).float()
        total = total + weights.sum(-1, keepdim=True)
        return (out / total).to(query.dtype).reshape(rows, 1, heads, -1)

    def _attend_fused(self, q, ks, vs, own_bias, layer, scale):
        """The same attention with the prompt part through the CPU flash kernel, which also returns its
        log-sum-exp, merged exactly with the own part (few keys per row: plain products are faster there).
        Only used where every row has prompt keys in reach (the kernel gives a row without any unmasked key
        a log-sum-exp of 0, not -inf)."""
        g = q.shape[2]
        part, part_lse = _FLASH_CPU(self._to_grid(q), self.kp[layer], self.vp[layer], 0.0, False,
                                    attn_mask=self.prompt_bias.to(q.dtype), scale=scale)
        part, part_lse = self._from_grid(part, g).float(), self._from_grid(part_lse[..., None], g)
        own = torch.matmul(q, ks.transpose(-1, -2)).float().mul_(scale)
        if own_bias is not None:
            own = own + own_bias
        top = torch.maximum(own.amax(-1, keepdim=True), part_lse)
        weights = own.sub_(top).exp_()
        a = (part_lse - top).exp_()
        out = torch.matmul(weights.to(vs.dtype), vs).float().add_(part * a)
        return out.div_(weights.sum(-1, keepdim=True).add_(a))

