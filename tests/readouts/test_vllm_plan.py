"""`--plan --generator vllm`: the requests it counts are the ones the vLLM generator sends (in the same order and
phases), the continuous batching it assumes is worked by hand on small cases, and the server it plans for leaves
the project's own model its memory."""

import dataclasses

import pytest

from engine.batching import CUDA_CONTEXT_RESERVE
from engine.vllm_generation import GROUP_PROMPTS, GeneratorSpec, VllmGenerator
from engine.vllm_server import GPU_SHARE, ServerSettings, gpu_memory_utilization
from readouts import vllm_plan
from readouts.plan import DECODE_EFFICIENCY, GPUS, PREFILL_EFFICIENCY, ModelSize, StageWork
from readouts.vllm_plan import HOST_FLOOR, Server, asked, phase_steps, server_for, vllm_estimate


def test_continuous_batching_by_hand():
    # Two slots: the first two requests run 4 steps together; the third starts at step 4 and runs 2 alone.
    # At the middle of the first stretch (step 2) each holds 10 + 2 tokens; of the second (step 5), 10 + 1.
    assert phase_steps([(10, 4), (10, 4), (10, 2)], Server(slots=2, kv_tokens=10**6)) == [(4, 2, 24.0), (2, 1, 11.0)]
    # Room for two whole sequences of 14 tokens (30 < 3 x 14): the same stretches with three slots.
    assert phase_steps([(10, 4), (10, 4), (10, 2)], Server(slots=3, kv_tokens=30)) == [(4, 2, 24.0), (2, 1, 11.0)]
    # A request that frees its slot early lets the next one in while the other still runs.
    assert phase_steps([(0, 2), (0, 6), (0, 3)], Server(slots=2, kv_tokens=10**6)) == [(2, 2, 2.0), (3, 2, 5.0),
                                                                                         (1, 1, 5.5)]
    # A sequence longer than the whole room still runs, alone.
    assert phase_steps([(50, 10)], Server(slots=4, kv_tokens=20)) == [(10, 1, 55.0)]


def test_the_client_limits_the_batch():
    assert Server(slots=1024, kv_tokens=1, concurrency=64).width == 64
    # Two requests in flight: two rows holding half a token each at mid-step, twice, then the fifth alone.
    steps = phase_steps([(0, 1)] * 5, Server(slots=1024, kv_tokens=10**6, concurrency=2))
    assert steps == [(1, 2, 1.0)] * 2 + [(1, 1, 0.5)]


def sent_phases(prompts, budgets, n, length_of, monkeypatch, tmp_path):
    """The (prompt tokens, max_tokens) of every request the real generator sends, one list per batch it posts;
    each reply runs to its budget."""
    gen = VllmGenerator(GeneratorSpec(url="http://127.0.0.1:1/v1", model="m", identity={}, cache=str(tmp_path)))
    phases = []

    def many(bodies):
        phases.append([(len(b["prompt"]), b["max_tokens"]) for b in bodies])
        return [{"choices": [{"token_ids": [5] * b["max_tokens"], "finish_reason": "length"}]} for b in bodies]

    monkeypatch.setattr(gen, "_many", many)
    gen(None, prompts, max_new_tokens=budgets, stop_ids=frozenset({0}), n=n, temperature=1.0, seeds=list(range(len(prompts))),
        length_of=length_of)
    return phases


def test_the_planned_requests_are_the_ones_the_generator_sends(monkeypatch, tmp_path):
    # Leaders and followers (length_of) across more than one group of GROUP_PROMPTS prompts, budgets of several sizes.
    k = GROUP_PROMPTS + 20
    prompts = [tuple(range(3 + i % 7)) for i in range(2 * k)]
    budgets = [4 + i % 5 for i in range(k)] * 2
    ties = [None] * k + list(range(k))  # prompt k + i follows prompt i's lengths
    sent = sent_phases(prompts, budgets, 3, ties, monkeypatch, tmp_path)
    planned = asked(["J x3", 3, [len(p) for p in prompts], budgets, ties])
    assert planned == sent
    # A group closes at GROUP_PROMPTS prompts, followers counted: units of two, so three groups for k units, each
    # posted as its leaders' rollouts, then its followers'.
    assert len(sent) == 2 * -(-k // (GROUP_PROMPTS // 2)) == 6 and sum(map(len, sent)) == 3 * 2 * k


def test_estimate_by_hand():
    gpu = GPUS["h100"]
    size = ModelSize(params=8 * 10**9, weight_bytes=16 * 10**9, kv_bytes_per_token=131072)
    server = Server(slots=2, kv_tokens=10**6)
    st = StageWork("J", computed_tokens=1000, requests=[["J x1", 1, [10, 10, 10], [4, 4, 2], [None] * 3]],
                   reread_tokens_drawn=500, reread_tokens_max=7)
    t = vllm_estimate(st, size, gpu, server)
    bandwidth, matmul = gpu.bandwidth * DECODE_EFFICIENCY, gpu.bf16_flops * PREFILL_EFFICIENCY
    step = lambda held, rows: max((16e9 + held * 131072) / bandwidth, rows * 16e9 / matmul, HOST_FLOOR)  # noqa: E731
    assert t["decode_s"] == pytest.approx(4 * step(24, 2) + 2 * step(11, 1))
    assert t["prefill_s"] == pytest.approx(1000 * 16e9 / matmul)
    assert t["reread_s"] == pytest.approx(500 * 16e9 / matmul)  # the drawn text's reads, not the own row-cache bound
    first_token = vllm_estimate(dataclasses.replace(st, requests=[]), size, gpu, server)
    assert first_token["decode_s"] == 0 and first_token["reread_s"] == pytest.approx(7 * 16e9 / matmul)


def test_the_server_planned_for_each_card():
    size = ModelSize(params=8 * 10**9, weight_bytes=16 * 10**9, kv_bytes_per_token=131072)
    head = 4 * 128256 * 4096
    h100, a100 = server_for("h100", size, head), server_for("a100", size, head)
    assert h100.slots == 1024 and a100.slots == 256  # vLLM's defaults: H100/H200 against A100
    left = GPUS["h100"].memory - 2 * (size.weight_bytes + CUDA_CONTEXT_RESERVE) - head  # both copies, both contexts
    assert h100.kv_tokens == int(GPU_SHARE * left) // 131072


@pytest.mark.parametrize("gpu", ["h100", "h200", "a100", "l40s"])
def test_the_server_and_the_own_model_fit_one_gpu_together(gpu):
    """At Llama-3.1-8B dimensions in bf16: the own model's weights, head copy and context, plus the share vLLM is
    started with (its weights and its key/value room), stay within the card, with the own reads' share left."""
    total, weights, head = GPUS[gpu].memory, 16 * 10**9, 4 * 128256 * 4096
    share = gpu_memory_utilization(total, weights, head)
    own = weights + head + CUDA_CONTEXT_RESERVE
    server = weights + CUDA_CONTEXT_RESERVE
    assert 0 < share < 1 and own + share * total <= total
    left_for_reads = total - own - share * total
    assert left_for_reads == pytest.approx((1 - GPU_SHARE) * (total - own - server), abs=1)
    settings = ServerSettings(model_dir="/m", name="g", dtype="bfloat16", device="cuda", memory_share=share)
    command = settings.command("python", 8000)
    assert command[command.index("--gpu-memory-utilization") + 1] == f"{share:.4f}"
    assert settings.manifest()["gpu_memory_utilization"] == round(share, 4)
    assert "--gpu-memory-utilization" not in ServerSettings(model_dir="/m", name="g").command("python", 8000)


def test_plan_with_the_vllm_generator_on_the_command_line(capsys):
    from cli.main import main

    argv = ["run", "--plan", "--model", "tiny-qwen2", "--panel", "gap-v1", "--profile", "quick", "--limit", "4",
            "--gpu", "h100"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--generator", "vllm"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "generation on vLLM: up to 1,024 sequences at once" in out and "decoding batches" not in out
    assert any(line.startswith("total ") for line in out.splitlines())
    assert vllm_plan.MAX_SEQS_LARGE == 1024


def test_the_plan_counts_the_requests_a_run_sends(tmp_path, monkeypatch):
    """A gap run whose J and dose rollouts a (canned) vLLM server draws sends, request for request, what its plan
    lists: the same (prompt tokens, max_tokens) pairs, each reply running to its budget."""
    import json
    import uuid
    from collections import Counter

    from readouts.driver import ModelOptions, RunOptions, plan_run, run
    from readouts.gap import profile as gap_profile
    from readouts.gap.study import GapStudy
    from readouts.options import Generation
    from tests.readouts.test_plan import PROFILE
    from tests.served_helpers import CannedServer

    monkeypatch.setitem(gap_profile.PROFILES, PROFILE.name, PROFILE)
    seen = []

    def answer(body, _headers):
        seen.append((len(body["prompt"]), body["max_tokens"]))
        return json.dumps({"choices": [{"token_ids": [7] * body["max_tokens"], "finish_reason": "length"}]}).encode()

    server = CannedServer(answer)
    try:
        # A model name of its own: the generator's reply cache (keyed by it) holds no reply of another test run.
        generation = Generation("vllm", f"http://127.0.0.1:{server.port}/v1", f"m-{uuid.uuid4().hex}")
        options = RunOptions(model=ModelOptions("tiny-llama3"), profile=PROFILE.name, out=str(tmp_path / "run"),
                             progress=False, generation=generation)
        rows, _, _, line = plan_run(GapStudy(readouts="J,dose"), options, "h100")
        run(GapStudy(readouts="J,dose"), options, log=lambda _: None)
    finally:
        server.close()
    planned = Counter(r for row in rows[:-1] for call in row["requests"] for phase in asked(call) for r in phase)
    assert line is not None and sum(planned.values()) == rows[-1]["rollouts"] > 0
    assert Counter(seen) == planned
