"""`readout run --plan`: the workload per stage before any weights load, equal to what the run then does
(reads per stage, generated tokens within the bound, prompt tokens as the probes record them), and its
estimate on a named GPU."""

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest

import engine.loading as loading
from cli.main import main
from engine import batching
from engine.decode import bucket
from engine.errors import ReadoutError
from engine.generation import plan_batches
from readouts.driver import ModelOptions, RunOptions, plan_run, run
from readouts.gap import profile as gap_profile
from readouts.gap.study import GapStudy
from readouts.nsi.study import NsiStudy
from readouts.plan import GPUS, HOST_OPS, LAUNCH_SECONDS, ModelSize, StageWork, estimate, gpu_batch_bounds, model_size
from tests.helpers import SMOLLM2

PROFILE = dataclasses.replace(gap_profile.PROFILES["quick"], name="plan-test", max_units=2, chunk_size=1,
                              orders={"D": 3, "J0": 2, "control": 2, "raw": 2}, j_samples=1, j_budget=5,
                              dose_samples=1, dose_budget=5, dose_brief_budget=3, rider_rollouts=2, rider_budget=7)


PROFILE_CHUNKS = range(2)  # max_units=2 in chunks of 1


@pytest.fixture(autouse=True)
def plan_profile(monkeypatch):
    monkeypatch.setitem(gap_profile.PROFILES, "plan-test", PROFILE)


def test_the_plan_is_the_run(tmp_path, monkeypatch):
    # Few rows per generation batch, so that a chunk's calls are cut into several batches (plan and run alike).
    monkeypatch.setitem(batching.DEFAULT_BOUNDS, "generate", {**batching.DEFAULT_BOUNDS["generate"], "cpu": (4096, 6)})
    options = RunOptions(model=ModelOptions("tiny-llama3"), profile="plan-test", out=str(tmp_path / "run"), progress=False)
    with monkeypatch.context() as m:
        for module in (loading,):
            m.setattr(module, "load_model", lambda *a, **k: pytest.fail("--plan loaded a model"))
        rows, size, header, _ = plan_run(GapStudy(), options, "h200")
    assert "2 records in 2 chunks of 1" in header and size.params > 0
    planned = {r["stage"]: r for r in rows}
    path = run(GapStudy(), options, log=lambda _: None)
    manifest = json.loads((path / "manifest.json").read_text())
    probes = pd.read_parquet(path / "probes.parquet")
    done = manifest["last_session"]["items_by_stage"]
    assert set(done) == set(planned) - {"total"}
    for stage, count in done.items():
        assert planned[stage]["reads"] == count, stage
    first_token = probes[probes.generated_tokens.isna()]
    for stage in ("D", "J0", "control"):
        read = first_token[first_token.readout == stage].prompt_tokens.sum()
        assert abs(planned[stage]["prompt_tokens"] - read) <= 0.01 * read  # other orders counted as the first
        assert 0 < planned[stage]["computed_tokens"] < planned[stage]["prompt_tokens"]  # orders share their prefix
    generated = probes[probes.readout.isin(["J", "dose_reasoning", "dose_filler", "dose_brief", "dose_norm"])
                       & (probes.rollout >= 0)].generated_tokens.sum()
    assert 0 < generated <= planned["J"]["generated_max"] + planned["dose"]["generated_max"]
    assert manifest["workload_by_stage"]["D"]["reads"] == planned["D"]["reads"]
    # The decoding batches the run formed, call by call, are the ones the plan forms under the run's bounds; the
    # rider (and the brief arm) are calls of their own, never batched with budgets other than their own.
    formed = manifest["last_session"]["decode_batches_by_stage"]
    assert set(formed) == {"J", "dose"}
    for stage, batches in formed.items():
        assert batches == manifest["workload_by_stage"][stage]["decode_batches"], stage
        assert len(batches) > 2 * len(PROFILE_CHUNKS) and max(rows for _, rows, _, _ in batches) <= 6
    budgets = {}
    for label, *_, budget in formed["dose"]:
        budgets.setdefault(label, set()).add(budget)
    assert budgets == {"dose_reasoning+dose_filler+dose_norm x2": {5}, "dose_brief x2": {3}, "dose_rider x2": {7}}


def test_rereads_run_the_anchor_suffix_where_the_rows_cache_is_held():
    """After generation a read runs only the anchor suffix on top of the row's own cache while its batch's
    row caches have room (each row counted at its whole budget), and the text and the anchor where they have
    none: one J chunk of the plan-test profile (1 scenario, budget 5, one read per row), planted bounds."""
    from engine.generation import BatchBounds
    from engine.loading import load_tokenizer_config
    from panels.schema import load_panel
    from readouts.gap.plan import gap_workload
    from readouts.gap.recipe import ANCHOR_ALLOWANCE

    tok, _ = load_tokenizer_config("tiny-llama3")
    chunk = load_panel("gap-v1").records[:1]

    def j_stage(room, rows_per_batch=128):
        bounds = BatchBounds(4096, rows_per_batch, None, True, room, kv_bytes_per_token=10)
        return next(st for st in gap_workload(tok, [chunk], PROFILE, ("J",), 0, bounds) if st.stage == "J")

    rows = j_stage(None).reads
    assert rows == j_stage(None).rollouts > 3 and j_stage(None).reread_tokens_max == rows * ANCHOR_ALLOWANCE
    assert j_stage(0).reread_tokens_max == rows * (5 + ANCHOR_ALLOWANCE)  # nothing held: the old re-encode
    # Room for three rows of 5 tokens x 10 bytes: the others re-encode.
    assert j_stage(3 * 50 + 49).reread_tokens_max == 3 * ANCHOR_ALLOWANCE + (rows - 3) * (5 + ANCHOR_ALLOWANCE)
    # The room is one batch's: the runner reads each batch on its rows' caches and lets them go before the next.
    # In batches of one prompt's rollouts (fewer than three rows), every row is held.
    from contract.readouts import readout
    from readouts.gap.profile import rollouts

    n = rollouts(readout("J"), PROFILE)
    assert n < 3 and j_stage(3 * 50 + 49, rows_per_batch=n).reread_tokens_max == rows * ANCHOR_ALLOWANCE


def test_plan_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--plan", "--model", "tiny-qwen2", "--panel", "gap-v1", "--profile", "paper", "--gpu", "h100"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "profile paper, 140 records in 35 chunks of 4" in out and "NVIDIA H100" in out
    assert any(line.startswith("total ") for line in out.splitlines())
    assert "estimate on NVIDIA H100" in out and "(GPUs only: on a CPU the run takes far longer)" in out
    calls = [line.split(":")[0].strip() for line in out.splitlines() if line.startswith("  ")]
    assert calls == ["J J x9", "dose dose_reasoning+dose_filler+dose_norm x4", "dose dose_brief x4", "dose dose_rider x8"]
    with pytest.raises(SystemExit) as exc:
        main(["run", "--plan", "--model", "tiny-qwen2", "--gpu", "tpu"])
    assert exc.value.code != 0


def test_unknown_gpu_is_refused():
    with pytest.raises(ReadoutError, match="--gpu: 'tpu'"):
        from readouts.plan import plan_table

        plan_table([], ModelSize(1, 2, 3), "tpu")


def test_estimate_bounds():
    """Prefill is matmul-bound; a decoding step of a narrow batch is bandwidth-bound: weights read once per step."""
    gpu = GPUS["h200"]
    size = ModelSize(params=7 * 10**9, weight_bytes=14 * 10**9, kv_bytes_per_token=131072)
    st = StageWork("J", computed_tokens=10**6, decode_batches=[["J x1", 1, 100, 512]])
    times = estimate(st, size, gpu)
    assert times["prefill_s"] == pytest.approx(10**6 * 2 * 7e9 / (989e12 * 0.5))
    step = (14e9 + (100 + 256) * 131072) / (4.8e12 * 0.7)
    assert times["decode_s"] == pytest.approx(512 * step)
    # A step whose launches take the host longer than the device's work is host-bound: 2,000 launches (the
    # dynamic path's count at 32 layers) at LAUNCH_SECONDS each, against a 6 ms device step.
    hosted = dataclasses.replace(size, host_ops_per_step=2000)
    assert estimate(st, hosted, gpu)["decode_s"] == pytest.approx(512 * 2000 * LAUNCH_SECONDS)
    assert 2000 * LAUNCH_SECONDS > step
    # Static shapes (the cascade backend on CUDA): 100 rows step in the bucket of 128, each reading its own buffer
    # whole, 64 slots for the first 64 steps, then 128, 256 and 512 (344 on average over 512 steps).
    static = dataclasses.replace(size, static=True)
    st = StageWork("J", decode_batches=[["J x9", 100, 5000, 512]])
    step = max((14e9 + (5000 + 128 * 344) * 131072) / (4.8e12 * 0.7), 128 * 2 * 7e9 / (989e12 * 0.5))
    assert estimate(st, static, gpu)["decode_s"] == pytest.approx(512 * step)
    # Each own span is a graph captured (64, 128, 256 and 512 slots: 4), at the capture's launches of host time; a
    # batch of 64 new tokens is one graph.
    captured = dataclasses.replace(static, capture_ops=5400)
    st = StageWork("J", decode_batches=[["J x9", 100, 5000, 512], ["J x9", 100, 5000, 64]])
    got = estimate(st, captured, gpu)
    step64 = max((14e9 + (5000 + 128 * 64) * 131072) / (4.8e12 * 0.7), 128 * 2 * 7e9 / (989e12 * 0.5))
    assert got["captures"] == 5
    assert got["decode_s"] == pytest.approx(512 * step + 64 * step64 + 5 * 5400 * LAUNCH_SECONDS)
    assert estimate(st, size, gpu)["captures"] == 0  # dynamic shapes: nothing captured


def test_the_gpu_bounds_hold_the_keys_and_values_in_half_the_memory_left():
    """--plan's batches on a GPU: the default rows, and half the memory beside the weights, the fp32 copy of the head
    and the CUDA context's 1 GiB for keys/values (what engine.batching.generation_cache_limit gives a run there), the
    rows padded to their bucket; OLMo-3's full multi-head caches fit fewer rows."""
    from transformers import AutoConfig

    olmo = AutoConfig.for_model("olmo3", vocab_size=100278, hidden_size=4096, intermediate_size=11008,
                                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32)
    llama = AutoConfig.for_model("llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8)
    for config, per_token in ((olmo, 512 * 1024), (llama, 128 * 1024)):
        size = model_size(config)
        assert size.kv_bytes_per_token == per_token
        bounds = gpu_batch_bounds(config, size, "h200")
        assert bounds.max_rows == 512 and bounds.cascade
        head_copy = 4 * config.vocab_size * config.hidden_size  # engine.head's fp32 copy of the bf16 head
        assert bounds.kv_limit == int(0.5 * (143771 * 2**20 - size.weight_bytes - head_copy - 2**30)) // per_token
        assert bounds.static
        assert size.host_ops_per_step == HOST_OPS["graph_outside_forward"] + HOST_OPS["graph_replay"]
        per_layer = HOST_OPS["per_layer"].get(config.model_type, HOST_OPS["per_layer_default"])
        assert size.capture_ops == 3 * 32 * per_layer
    # At 512 new tokens, a batch of 512 rows holds 262k tokens: more than OLMo-3's limit, within Llama's.
    lengths, budgets = [300] * 128, [512] * 128
    olmo_batches = plan_batches(lengths, budgets, 4, gpu_batch_bounds(olmo, model_size(olmo), "h200"))
    llama_batches = plan_batches(lengths, budgets, 4, gpu_batch_bounds(llama, model_size(llama), "h200"))
    assert len(llama_batches) == 1 and len(olmo_batches) > 1
    limit = gpu_batch_bounds(olmo, model_size(olmo), "h200").kv_limit
    for batch in olmo_batches:
        members = [i for u in batch for i in u]
        assert len(members) * 300 + bucket(4 * len(members)) * 512 <= limit


def test_host_ops_are_the_benchmarks_counts():
    """HOST_OPS is bench/results/host_bench_graph.json's counts (rerun the bench when the decode loop changes): the
    graph path's and the dynamic path's ops outside the forward, and the forward's ops per layer of each layout (rounded
    up)."""
    results = json.loads((Path(__file__).resolve().parents[2] / "bench/results/host_bench_graph.json").read_text())["results"]
    by = {(r["layout"], r["mode"]): r for r in results}
    for layout, per_layer in (("llama-8b-layout", HOST_OPS["per_layer_default"]), ("olmo3-7b-layout", HOST_OPS["per_layer"]["olmo3"])):
        graph, dynamic = by[layout, "static-check8-gpu-ops"], by[layout, "dynamic-gpu-ops"]
        assert round(graph["outside_forward_ops_per_step"]) == HOST_OPS["graph_outside_forward"]
        assert round(dynamic["outside_forward_ops_per_step"]) == HOST_OPS["dynamic_outside_forward"]
        assert math.ceil((dynamic["ops_per_step"] - dynamic["outside_forward_ops_per_step"]) / graph["layers"]) == per_layer


@pytest.mark.parametrize("name", ["tiny-olmo3", "tiny-qwen2", "tiny-llama3", SMOLLM2])
def test_model_size_from_the_config(name):
    from tests.helpers import get_model

    lm = get_model(name)
    built = sum(p.numel() for p in lm.model.parameters())
    assert abs(model_size(lm.model.config).params - built) <= 0.01 * built


@pytest.mark.parametrize("name", ["tiny-olmo3", "tiny-qwen2", "tiny-llama3", "tiny-tulu3", "tiny-base", SMOLLM2])
def test_the_plan_tokenizer_is_the_runs(name):
    """--plan reads config.json as the generic config (no architecture import); the tokenizer it then gets
    is the run's: same class, same chat and raw ids, same BOS; the config gives the same model size."""
    from engine.render import Prompt, encode_prompts
    from tests.helpers import get_model

    tok, config = loading.load_tokenizer_config(name)
    lm = get_model(name)
    assert type(tok) is type(lm.tokenizer) and tok.bos_token_id == lm.tokenizer.bos_token_id
    prompts = [Prompt(text="Answer: B")]
    if lm.tokenizer.chat_template:
        prompts += [Prompt(messages=({"role": "user", "content": "Which option, A or B?"},)),
                    Prompt(messages=({"role": "user", "content": "Pick one."},), system="Be brief.")]
    assert encode_prompts(tok, prompts) == encode_prompts(lm.tokenizer, prompts)
    assert model_size(config) == model_size(lm.model.config)


def test_the_nsi_plan_is_the_nsi_run(tmp_path, monkeypatch):
    options = RunOptions(model=ModelOptions("tiny-olmo3"), panel="nsi-14", profile="quick", out=str(tmp_path / "nsi"),
                         overrides=("samples=1", "budget=6", "max_units=3"), progress=False)
    with monkeypatch.context() as m:
        for module in (loading,):
            m.setattr(module, "load_model", lambda *a, **k: pytest.fail("--plan loaded a model"))
        rows, size, _, _ = plan_run(NsiStudy(), options, "a100")
    planned = {r["stage"]: r for r in rows}
    path = run(NsiStudy(), options, log=lambda _: None)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["last_session"]["items_by_stage"] == {"replies": planned["replies"]["reads"],
                                                          "continuous": planned["continuous"]["reads"]}
    replies, continuous = pd.read_parquet(path / "nsi_replies.parquet"), pd.read_parquet(path / "nsi_continuous.parquet")
    assert planned["continuous"]["prompt_tokens"] == continuous.prompt_tokens.sum()
    formed = manifest["last_session"]["decode_batches_by_stage"]
    assert formed["replies"] == manifest["workload_by_stage"]["replies"]["decode_batches"]
    assert [label for label, *_ in formed["replies"]] == ["replies x2"] * len(formed["replies"])
    assert planned["replies"]["rollouts"] == len(replies) and planned["replies"]["generated_max"] == 6 * len(replies)
    assert 0 < replies.generated_tokens.sum() <= planned["replies"]["generated_max"]
    assert 0 < planned["replies"]["computed_tokens"] < planned["replies"]["prompt_tokens"]  # framings share a prefix
    assert planned["total"]["total_s"] > 0


def test_plan_estimates_gpus_only_and_refuses_cpu(tmp_path, monkeypatch, capsys):
    """`--gpu cpu` is one line and exit 2, naming the GPUs it knows and saying that --plan estimates GPUs only (the
    plan once printed "total 0.1s" for a CPU run of 23 minutes). The plan's own estimate line says GPUs only too
    (test_plan_on_the_command_line)."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--plan", "--model", "tiny-qwen2", "--panel", "gap-v1", "--profile", "quick", "--limit", "2"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--gpu", "cpu"])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "--gpu: 'cpu'" in err and ", ".join(GPUS) in err and "--plan estimates GPUs only" in err, err
    assert not any(tmp_path.iterdir())  # nothing written
