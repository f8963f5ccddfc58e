"""`--plan` with `--generator vllm`: what a run whose rollouts a vLLM server draws should cost on a named GPU.

The requests are the run's own (each `generate` call's prompts, budgets and ties, StageWork.requests) asked as
engine/vllm_generation.py asks them: GROUP_PROMPTS prompts at a time (with the prompts whose lengths follow theirs),
the leaders' rollouts first and the followers' after them, at most CONCURRENCY["cuda"] requests in flight. The server
runs them by continuous batching: a request starts as soon as a sequence slot (vLLM's `max_num_seqs`) and room for
its whole length in the key/value cache (engine.vllm_server.server_room: a share of what the own model leaves) are
free, and leaves when it has decoded its budget (every rollout to its budget: an upper bound, as the own plan's).
Each step reads the weights once and every running sequence's keys/values, or is matmul-bound for a very wide batch,
at readouts/plan.py's efficiencies. Prompts are prefilled twice: by the server (prefix caching: the prompts' shared
prefixes once) and by the own exact forward that reads the letters after the drawn text, which runs each read's
text and anchor too (no row cache is held for text drawn elsewhere). Not counted: the server's start-up and the host
side of its steps beyond HOST_FLOOR (its scheduler and sampler), neither measured on a GPU here; prefix sharing of keys/values between
the rollouts of one prompt (each sequence is counted whole, which narrows the batch the room admits). A step takes
at least HOST_FLOOR of host time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from engine.vllm_generation import CONCURRENCY, GROUP_PROMPTS
from engine.vllm_server import GPU_SHARE, server_room
from readouts.plan import DECODE_EFFICIENCY, GPUS, HOST_OPS, LAUNCH_SECONDS, PREFILL_EFFICIENCY, Gpu, ModelSize, StageWork

HOST_FLOOR = (HOST_OPS["graph_outside_forward"] + HOST_OPS["graph_replay"]) * LAUNCH_SECONDS
"""The least host time a server's step takes here: the own CUDA graph path's launches per step (vLLM also replays a
graph per step; its scheduler's and sampler's host time beyond that is not measured, so not counted)."""
MAX_SEQS_LARGE, MAX_SEQS = 1024, 256
"""vLLM 0.32's API server's default `max_num_seqs`: 1024 on a GPU of 70 GiB or more other than an A100, else 256
(vllm/engine/arg_utils.py, `get_batch_defaults`)."""


@dataclass(frozen=True)
class Server:
    """The vLLM server a plan assumes: sequence slots, key/value room (tokens) and the client's requests in flight."""

    slots: int
    kv_tokens: int
    concurrency: int = CONCURRENCY["cuda"]

    @property
    def width(self) -> int:
        return min(self.slots, self.concurrency)


def server_for(gpu_name: str, size: ModelSize, head_copy: int) -> Server:
    """The server the project would start on `gpu_name` beside its own copy of the model (`size`, `head_copy` bytes
    of fp32 head): vLLM's default slots for that card and GPU_SHARE of the memory the own model leaves."""
    gpu = GPUS[gpu_name]
    large = gpu.memory >= 70 * 2**30 and "A100" not in gpu.name
    room = server_room(gpu.memory, size.weight_bytes, head_copy)
    return Server(MAX_SEQS_LARGE if large else MAX_SEQS, room // size.kv_bytes_per_token)


def asked(call: list) -> list[list[tuple[int, int]]]:
    """One `generate` call's requests in the order the generator sends them: a list of phases (the leaders' rollouts of
    a group of prompts, then their followers'), each a list of (prompt tokens, budget) per rollout."""
    _, n, lengths, budgets, ties = call
    follow: dict[int, list[int]] = {}
    for i, k in enumerate(ties):
        if k is not None:
            follow.setdefault(k, []).append(i)
    units = [[i, *follow.get(i, [])] for i in range(len(lengths)) if ties[i] is None]
    groups, group = [], []
    for unit in units:
        group.append(unit)
        if sum(len(u) for u in group) >= GROUP_PROMPTS:
            groups.append(group)
            group = []
    if group:
        groups.append(group)
    phases = []
    for g in groups:
        for members in ([u[0] for u in g], [i for u in g for i in u[1:]]):
            phase = [(lengths[i], budgets[i]) for i in members for _ in range(n) if budgets[i] > 0]
            if phase:
                phases.append(phase)
    return phases


def phase_steps(requests: list[tuple[int, int]], server: Server) -> list[tuple[int, int, float]]:
    """Continuous batching of one phase: (steps, running sequences, mean key/value tokens they hold) per stretch of
    steps in which the running set does not change. A request starts, in order, when a slot is free and its whole
    length (prompt and budget) fits the room left; it holds its prompt and one token more each step."""
    waiting = list(requests)[::-1]
    running: list[tuple[int, int, int, int]] = []  # (finishing step, starting step, prompt tokens, budget)
    prompts, starts, room, t, out = 0, 0, server.kv_tokens, 0, []
    while waiting or running:
        while waiting and len(running) < server.width and (not running or sum(waiting[-1]) <= room):
            prompt, budget = waiting.pop()
            heapq.heappush(running, (t + budget, t, prompt, budget))
            room, prompts, starts = room - prompt - budget, prompts + prompt, starts + t
        end, rows = running[0][0], len(running)
        out.append((end - t, rows, prompts + rows * (t + end) / 2 - starts))
        while running and running[0][0] == end:
            _, start, prompt, budget = heapq.heappop(running)
            room, prompts, starts = room + prompt + budget, prompts - prompt, starts - start
        t = end
    return out


def vllm_estimate(stage: StageWork, size: ModelSize, gpu: Gpu, server: Server) -> dict:
    """Seconds for one stage on `gpu` when `server` draws its rollouts (prefill on both sides, the server's decoding,
    the own reads after the drawn text); the same keys as readouts.plan.estimate."""
    matmul = gpu.bf16_flops * PREFILL_EFFICIENCY
    bandwidth = gpu.bandwidth * DECODE_EFFICIENCY
    drawn = bool(stage.requests)
    prefill = stage.computed_tokens * 2 * size.params / matmul  # the server's, or the own first-token reads
    decode = 0.0
    for call in stage.requests:
        for phase in asked(call):
            for steps, rows, held in phase_steps(phase, server):
                step = max((size.weight_bytes + held * size.kv_bytes_per_token) / bandwidth, rows * 2 * size.params / matmul,
                           HOST_FLOOR)
                decode += steps * step
    reread = (stage.reread_tokens_drawn if drawn else stage.reread_tokens_max) * 2 * size.params / matmul
    return {"prefill_s": prefill, "decode_s": decode, "reread_s": reread, "total_s": prefill + decode + reread,
            "captures": 0, "capture_s": 0.0}


def server_line(server: Server) -> str:
    """What the vLLM estimate assumed, as `--plan` prints it."""
    return (f"generation on vLLM: up to {server.width:,} sequences at once (vLLM's max_num_seqs {server.slots:,}, "
            f"{server.concurrency:,} requests in flight), {server.kv_tokens:,} tokens of key/value room "
            f"({GPU_SHARE:.0%} of the memory both copies of the model leave); a step takes at least {HOST_FLOOR * 1e3:.2f} ms of host "
            "time; not counted: the server's start-up and its scheduler's time per step (not measured on a GPU)")


def vllm_plan_table(stages: list[StageWork], size: ModelSize, gpu_name: str, config) -> tuple[list[dict], str]:
    """readouts.plan.plan_table's rows with every stage's rollouts drawn by a vLLM server on `gpu_name` (the model's
    `config` gives the own reader's head copy), and what the estimate assumed (server_line)."""
    from readouts.plan import head_copy_of, plan_table

    server = server_for(gpu_name, size, head_copy_of(config, size))
    return plan_table(stages, size, gpu_name, lambda st, sz, dev: vllm_estimate(st, sz, dev, server)), server_line(server)
