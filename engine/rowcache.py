"""The rows' own caches after generation: each finished rollout's keys/values (its prompt's, then those of
the generated tokens the decoding steps fed), kept so that reading a letter after the anchor runs only the
tokens past what the row already holds (the anchor suffix, or nothing but the last token) on top of them,
instead of re-encoding prompt and generated text.

A `RowCaches` is a known-prefix store for `engine.scoring.score_ids(known_prefixes=...)`: a prompt is served
the longest stored prefix it starts with, and a row serves every prefix of its own tokens (the model's own
anchor usually stands inside the generated text). Whole prompts' caches (`generate(prefix_kv=...)`) are held
alongside. Rows are held up to a memory limit; a row that does not fit is not held, and its read re-encodes
the text as before (the same numbers within float tolerance: the same model over the same tokens).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

DEFAULT_CPU_BYTES = 1 << 30
"""Bytes of row caches held on CPU (a quarter of the usable memory on CUDA: engine.batching.usable_memory)."""


ROW_CACHE_SHARE = 0.25
"""Share of a CUDA device's usable memory the rows' own caches of one stage may hold (`--plan` uses it too)."""


class RowCaches(Mapping):
    """Known prefixes ({token tuple: [(keys, values) per layer], each [1, heads, len, dim]}) plus rows that
    serve any prefix of their tokens. `limit_bytes` None: set by the first `generate` that fills it."""

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.rows_held = 0
        self.rows_dropped = 0
        self._whole: dict[tuple, list] = {}
        # prompt tuple -> [(generated tokens with keys, own keys/values per layer [1, H, m, D])]
        self._rows: dict[tuple, list[tuple[tuple, list]]] = {}

    # -- filling -----------------------------------------------------------------------------------
    def update(self, items) -> None:
        """Whole prompts' caches ({prompt tuple: layers}), as `generate(prefix_kv=...)` publishes them."""
        self._whole.update(dict(items))

    def __setitem__(self, key, layers) -> None:
        self._whole[tuple(key)] = layers

    def add_row(self, prompt: tuple, tokens: tuple, own: list) -> bool:
        """Hold one row: `tokens` the generated tokens whose keys/values `own` holds ([(k, v) per layer], each
        [1, H, len(tokens), D]), on top of its prompt's cache (which must be held: `update`). False when it
        does not fit under the limit (its reads then re-encode)."""
        if not tokens:
            return False
        size = _bytes(own)
        if self.limit_bytes is not None and self.held_bytes + size > self.limit_bytes:
            self.rows_dropped += 1
            return False
        self._rows.setdefault(tuple(prompt), []).append((tuple(tokens), own))
        self.held_bytes += size
        self.rows_held += 1
        return True

    def release(self, prompts) -> None:
        """Let go of `prompts`' caches: their whole prompts' and their rows' (which then no longer count against
        the limit)."""
        for prompt in map(tuple, prompts):
            self._whole.pop(prompt, None)
            for _, own in self._rows.pop(prompt, ()):
                self.held_bytes -= _bytes(own)
                self.rows_held -= 1

    # -- serving -----------------------------------------------------------------------------------
    def longest_prefix(self, seq) -> int:
        """The length of the longest held prefix of `seq` that leaves at least one token after it (0: none)."""
        seq = tuple(seq)
        best = next((len(k) for k in sorted(self._whole, key=len, reverse=True) if len(k) < len(seq)
                     and seq[: len(k)] == k), 0)
        for prompt, rows in self._rows.items():
            n = len(prompt)
            if n >= len(seq) or seq[:n] != prompt or prompt not in self._whole:
                continue
            for tokens, _ in rows:
                m = _common(tokens, seq[n:], len(seq) - n - 1)
                best = max(best, n + m)
        return best

    def __getitem__(self, key):
        key = tuple(key)
        if key in self._whole:
            return self._whole[key]
        for n in sorted({len(p) for p in self._rows}, reverse=True):
            prompt, rest = key[:n], key[n:]
            for tokens, own in self._rows.get(prompt, ()):
                if prompt in self._whole and len(rest) <= len(tokens) and tokens[: len(rest)] == rest:
                    m = len(rest)
                    return [(torch.cat([pk, ok[:, :, :m]], dim=2), torch.cat([pv, ov[:, :, :m]], dim=2))
                            for (pk, pv), (ok, ov) in zip(self._whole[prompt], own)]
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        key = tuple(key)
        return key in self._whole or self.longest_prefix(key + (-1,)) == len(key)

    def __iter__(self):
        return iter(self._whole)

    def __len__(self) -> int:
        return len(self._whole)


def _bytes(layers) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


def _common(a: tuple, b: tuple, most: int) -> int:
    """Length of the common prefix of a and b, at most `most`."""
    n = min(len(a), len(b), most)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def default_limit(model, device: torch.device) -> int:
    if device.type == "cuda":
        from engine.batching import usable_memory

        return int(ROW_CACHE_SHARE * usable_memory(model, device))
    return DEFAULT_CPU_BYTES
