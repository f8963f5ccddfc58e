"""Generation on vLLM: rollouts drawn by a vLLM server (one the project starts, engine/vllm_server.py, or one it
is pointed at), then read by the project's own exact forward like any other text.

`VllmGenerator` is called like engine.generation.generate and returns the same `Rollout`s. Each rollout is one
completion request: the prompt as token ids (nothing re-tokenized), the rollout's own budget and stop tokens, and
for a sampled rollout the temperature, top-p and a seed derived from the prompt's seed and the rollout's index
(derive_seed(seed, j), as the own decoder keys its draws), so a rollout does not depend on how many rollouts or
prompts were asked with it. The reply's token ids come back as they are (`return_token_ids`); a trailing stop
token is dropped, as the own decoder leaves it out. A rollout tied to another's length (`length_of`) is asked for
exactly that many tokens with its stop tokens masked until then (`min_tokens` = `max_tokens`), after its leader's
rollouts are known.

Every reply is kept on disk (engine/served_client.py's cache), keyed by the generator's identity (checkpoint,
adapter, dtype, vLLM version, whether batch-invariant) and the request, never by the server's address: a killed
run resumes without asking again, a rerun reads the cache. The exactness of the readout is in the letter reads,
which the caller makes with its own fp32 (or bf16) forward of prompt + drawn text, not in the sampler.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

from engine.generation import Rollout, checked_request
from engine.sampling import derive_seed
from engine.served_client import SEEDED_PREFILL_CRASH, Client, ClientSettings, ReplyCache, ServedError

CONCURRENCY = {"cpu": 64, "cuda": 1024}
"""Requests a generator keeps in flight, by the device of the run: on a GPU, vLLM's own limit of running sequences
on an H100 or H200 (`max_num_seqs`' default for its API server, vLLM 0.32), so the server can batch as wide as the
own decoder does; on the CPU, fewer (its server runs at most 128)."""
GROUP_PROMPTS = 64
"""Prompts whose rollouts are asked for before the caller reads them (`on_rollouts`): the server batches every
request in flight, so this bounds only what the caller holds between reads."""
NOT_APPLICABLE = frozenset({"pad_id", "token_budget", "max_rows", "prefix_kv", "static_shapes", "compact", "row_kv",
                            "check_every", "batches"})
"""`generate`'s own decoder's batching and cache arguments: vLLM batches and caches by itself; they are accepted
and have no effect (a caller's row caches stay empty, so its reads run whole prompts)."""


@dataclass(frozen=True)
class GeneratorSpec:
    """Where the rollouts come from: `url` of a vLLM server's /v1 and the model name it answers to."""

    url: str
    model: str
    identity: dict
    """What the drawn texts depend on besides the request (recorded; keys the cache)."""
    concurrency: int = CONCURRENCY["cpu"]
    cache: str | None = None


class VllmGenerator:
    """Rollouts from a vLLM server, with engine.generation.generate's signature (`model` is ignored: the server
    holds its own copy of the same checkpoint)."""

    name = "vllm"

    def __init__(self, spec: GeneratorSpec, server=None):
        from engine.paths import cache_root

        self.spec, self.server = spec, server
        key = hashlib.sha256(json.dumps(spec.identity, sort_keys=True).encode()).hexdigest()[:16]
        cache = ReplyCache(spec.cache or cache_root() / "vllm-rollouts")
        self.client = Client(spec.url, spec.model, None, cache,
                             ClientSettings(concurrency=spec.concurrency, retries=3, timeout=600.0))
        self.client.cache_identity = f"vllm:{key}"  # not the address: a restarted server answers from the cache

    def manifest(self) -> dict:
        return {"name": self.name, **self.spec.identity, "requests": {"sent": self.client.sent,
                                                                      "from_cache": self.client.cached}}

    def __call__(self, model, prompts: Sequence[Sequence[int]], *, max_new_tokens, stop_ids, n: int = 1,
                 greedy_first: bool = False, temperature: float = 0.0, top_p: float = 1.0, seeds=None,
                 length_of=None, on_batch=None, on_rollouts=None, **engine_only) -> list[list[Rollout]]:
        if self.server is not None and not self.server.alive():
            self.server.start()
        unknown = set(engine_only) - NOT_APPLICABLE
        if unknown:
            raise TypeError(f"VllmGenerator: unexpected arguments {sorted(unknown)}")
        budgets, leaders = checked_request(prompts, max_new_tokens, n, length_of)
        seeds = list(seeds) if seeds is not None else [0] * len(prompts)
        follow: dict[int, list[int]] = {}
        for i, k in enumerate(leaders):
            if k is not None:
                follow.setdefault(k, []).append(i)
        units = [[i, *follow.get(i, [])] for i in range(len(prompts)) if leaders[i] is None]
        stops = sorted(int(t) for t in stop_ids)
        out: list[list[Rollout] | None] = [None] * len(prompts)
        group: list[int] = []

        def sampled(j):
            return temperature > 0 and not (greedy_first and j == 0)

        def body(i, j, budget, tied):
            b = {"model": self.spec.model, "prompt": [int(t) for t in prompts[i]], "max_tokens": budget, "n": 1,
                 "stop_token_ids": stops, "return_token_ids": True, "skip_special_tokens": False}
            if sampled(j):
                b.update(temperature=float(temperature), top_p=float(top_p), seed=derive_seed(seeds[i], j))
            else:
                b.update(temperature=0.0)
            if tied:
                b["min_tokens"] = budget  # the stop tokens masked until the leader's length, as the own decoder does
            return b

        def ask(items):  # [(i, j, budget, tied)] -> their rollouts, in order
            asked = [k for k, it in enumerate(items) if it[2] > 0]
            replies = self._many([body(*items[k]) for k in asked])
            got: list[Rollout | None] = [Rollout((), False, not sampled(it[1])) for it in items]
            for k, reply in zip(asked, replies):
                got[k] = _rollout(reply, stop_ids, tied=items[k][3], greedy=not sampled(items[k][1]))
            return got

        def flush():
            first = [(i, j, budgets[i], False) for u in group for i in u[:1] for j in range(n)]
            for (i, _, _, _), r in zip(first, ask(first)):
                out[i] = (out[i] or []) + [r]
            tied = [(i, j, min(budgets[i], len(out[u[0]][j].tokens)), True) for u in group for i in u[1:] for j in range(n)]
            for (i, _, _, _), r in zip(tied, ask(tied)):  # after their leaders: their lengths are the leaders'
                out[i] = (out[i] or []) + [r]
            flat = [i for u in group for i in u]
            if on_rollouts is not None:
                on_rollouts(flat, [out[i] for i in flat])
            if on_batch is not None:
                on_batch(len(flat))

        for unit in units:
            group.append(unit)
            if sum(len(u) for u in group) >= GROUP_PROMPTS:
                flush()
                group = []
        if group:
            flush()
        return out

    def _many(self, bodies: list[dict]) -> list[dict]:
        try:
            return self.client.post_many("/completions", [(b, 0) for b in bodies], accept=_has_token_ids)
        except ServedError as exc:
            raise ServedError(self._cause(str(exc))) from None

    def _cause(self, message: str) -> str:
        """`message`, naming the cause when the server's engine has died (its log, or the reply, says so)."""
        line = self.server.died_of() if self.server is not None else None
        if line is None:
            return message
        hint = ("; seeded requests met chunked prefill, which the server started with --no-enable-chunked-prefill avoids"
                if SEEDED_PREFILL_CRASH in line else "")
        return f"the vLLM server the project started has died ({line}; log: {self.server.log}){hint}"


def _has_token_ids(reply: dict) -> bool:
    choices = reply.get("choices") or []
    return len(choices) == 1 and isinstance(choices[0].get("token_ids"), list)


def _rollout(reply: dict, stop_ids, tied: bool, greedy: bool) -> Rollout:
    choice = reply["choices"][0]
    tokens = [int(t) for t in choice["token_ids"]]
    stopped = not tied and choice.get("finish_reason") == "stop"
    if stopped and tokens and tokens[-1] in stop_ids:
        tokens = tokens[:-1]
    return Rollout(tuple(tokens), stopped, greedy)


SERVER_MAX_LEN = 8192
"""The longest sequence a started server admits when the checkpoint allows more (the panels' prompts and budgets
stay far below it; a longer context only takes key/value room from the batch)."""
LOCAL_NAME = "readout-generator"
"""The model name a server the project starts answers to."""


def start_generator(lm, url: str | None = None, model: str | None = None, log: str | None = None) -> VllmGenerator:
    """A generator for loaded model `lm`: pointed at the vLLM server at `url` (answering to `model`), or on one the
    project starts, on first use, for the same checkpoint folder, adapter, dtype and device (stopped by
    `close_generator`). Its identity records what the drawn texts depend on."""
    from engine.vllm_server import ServerSettings, VllmServer, check_servable, installed_version

    facts = lm.facts
    on_gpu = str(facts.device).startswith("cuda")
    server = None
    identity = {"checkpoint": facts.hf_id or facts.name, "revision": facts.revision,
                **({"weights_fingerprint": facts.weights_fingerprint} if facts.source == "local" else {}),
                **({"adapter": {k: v for k, v in facts.adapter.items() if k != "path"}} if facts.adapter else {})}
    if url is None:
        check_servable(lm.model.config, facts.device, facts.name)
        adapter = (facts.adapter or {}).get("path")
        settings = ServerSettings(model_dir=facts.path, name=LOCAL_NAME, dtype=facts.dtype.removeprefix("torch."),
                                  device=facts.device, max_model_len=min(lm.max_positions or SERVER_MAX_LEN, SERVER_MAX_LEN),
                                  adapter=adapter, adapter_rank=_adapter_rank(adapter),
                                  memory_share=_memory_share(lm.model, facts.device) if on_gpu else None)
        server = VllmServer(settings, log=log)
        url, model = server.url, LOCAL_NAME
        identity.update(vllm=installed_version(server.python), **settings.manifest())
    elif model is None:
        raise ServedError("--generator-url: name the model the server answers to (--generator-model)")
    else:
        identity.update(served_model=model)
    concurrency = CONCURRENCY["cuda" if on_gpu else "cpu"]
    return VllmGenerator(GeneratorSpec(url=url, model=model, identity=identity, concurrency=concurrency), server=server)


def _memory_share(model, device: str) -> float:
    """The `--gpu-memory-utilization` of a server beside `model` on CUDA `device` (engine.vllm_server)."""
    import torch

    from engine.batching import device_memory
    from engine.vllm_server import gpu_memory_utilization

    return gpu_memory_utilization(*device_memory(model, torch.device(device)))


def close_generator(generator) -> None:
    """Stop the server a generator started (nothing for the own decoder or a server the user runs)."""
    server = getattr(generator, "server", None)
    if server is not None:
        server.stop()


def _adapter_rank(folder: str | None) -> int:
    if folder is None:
        return 8
    from pathlib import Path

    rank = int(json.loads((Path(folder) / "adapter_config.json").read_text()).get("r", 8))
    return min(r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= rank)  # the ranks vLLM's --max-lora-rank takes
