"""The fallback decode state for architectures the cascade backend (engine/decode.py) does not decode: the model's
own attention and cache."""

from __future__ import annotations

from typing import Sequence

import torch

from engine.batching import pad_rows, spread_over_devices
from engine.scoring import ScoreStats


class Dense:
    """Fallback decode state: the model's own attention and cache (prompts left-padded, the prefill cache
    repeated for each row, grown by the model each step). Under a multi-device `device_map` the logits come
    back to the inputs' device, and the cache, whose layers sit on several devices, is indexed from the host."""

    def __init__(self, model, prompts: Sequence[Sequence[int]], row_prompt: Sequence[int], budget: int, *, pad_id: int, **_):
        from transformers import DynamicCache

        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.prompts = [list(p) for p in prompts]
        self.row_prompt = list(row_prompt)
        ids, mask = pad_rows(self.prompts, pad_id, self.device, left=True)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.cache = DynamicCache(config=model.config)
        self._prefill = (ids, mask, positions)
        select = torch.tensor(self.row_prompt, device=self.device)
        self.mask = mask[select]
        self.positions = positions[select, -1]
        self._select = select
        self._host_index = spread_over_devices(model)
        self.step_index = 0
        self._prompt_kv = None
        self.prefill_stats = ScoreStats(prompt_tokens=sum(len(p) for p in self.prompts),
                                        computed_tokens=sum(len(p) for p in self.prompts))

    def step(self, tokens: torch.Tensor | None = None) -> torch.Tensor:
        if tokens is None:
            ids, mask, positions = self._prefill
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1].float().to(self.device)
            width = ids.shape[1]
            self._prompt_kv = {tuple(p): [(layer.keys[b : b + 1, :, width - len(p):], layer.values[b : b + 1, :, width - len(p):])
                                          for layer in self.cache.layers] for b, p in enumerate(self.prompts)}
            self.cache.batch_select_indices(self._cache_index(self._select))
            self.step_index += 1
            return logits[self._select]
        self.positions = self.positions + 1
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)
        logits = self.model(input_ids=tokens[:, None], attention_mask=self.mask, position_ids=self.positions[:, None],
                            past_key_values=self.cache, use_cache=True).logits[:, -1].float().to(self.device)
        self.step_index += 1
        return logits

    def keep(self, rows: Sequence[int]) -> None:
        idx = torch.tensor(list(rows), device=self.device)
        self.cache.batch_select_indices(self._cache_index(idx))
        self.mask, self.positions = self.mask[idx], self.positions[idx]
        self.row_prompt = [self.row_prompt[r] for r in rows]

    def _cache_index(self, idx: torch.Tensor) -> torch.Tensor:
        return idx.cpu() if self._host_index else idx

    def prompt_kv(self) -> dict:
        return dict(self._prompt_kv or {})
