"""The CUDA side of the engine, checked on CPU: the static step's graph capture (torch.cuda's streams, graphs and
device context replaced by recording fakes, tiny-llama3 on a virtual cuda:1), what a failed capture does (out
of memory halves the batch, any other error leaves the steps eager), the key/value memory bounds at Llama-3.1-8B's
dimensions on an 80 GiB device (its properties mocked, a stand-in model whose weights report CUDA placement), and a
tuned lens trained on a bf16 model after it has read letters."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

import engine.batching as batching
import engine.decode as decode
from engine.generation import batch_bounds, plan_batches

PROMPTS = [[5, 17, 9, 33, 2, 41], [12, 3, 3, 29, 40, 7, 21, 16]]
GiB = 2**30


class FakeCuda:
    """torch.cuda's capture API, recorded: the current device (0 until a `device` context changes it), the device
    each stream and graph is made on, and the device current (and the stream passed) when a capture begins.
    `fail(state)` may return an exception for the capture to raise."""

    def __init__(self, fail=None):
        self.current = 0
        self.graphs, self.captures = [], []
        self.fail = fail or (lambda: None)
        cuda = self

        class Stream:
            def __init__(self, device=None):
                self.device = torch.device("cuda", cuda.current) if device is None else torch.device(device)

            def wait_stream(self, other):
                pass

        class CUDAGraph:
            def __init__(self):
                self.device = cuda.current
                cuda.graphs.append(self)

            def replay(self):
                pass

        self.Stream, self.CUDAGraph = Stream, CUDAGraph

    @contextlib.contextmanager
    def device(self, device):
        before, self.current = self.current, torch.device(device).index
        try:
            yield
        finally:
            self.current = before

    def current_stream(self, device=None):
        return self.Stream(device)

    @contextlib.contextmanager
    def stream(self, stream):
        yield

    @contextlib.contextmanager
    def graph(self, graph, pool=None, stream=None, **kwargs):
        self.captures.append(SimpleNamespace(current=self.current, graph_device=graph.device,
                                             stream=None if stream is None else stream.device))
        error = self.fail()
        if error is not None:
            raise error
        yield

    def install(self, monkeypatch):
        for name in ("Stream", "CUDAGraph", "device", "current_stream", "stream", "graph"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self


@pytest.fixture()
def on_cuda1(monkeypatch):
    """tiny-llama3 with its weights on cuda:1 (tests/engine/virtual_devices.py: CPU tensors tagged with the device,
    mixing two devices fails as on CUDA), while the test runs; the device has 80 GiB beside them."""
    from tests.engine.virtual_devices import TAG, VirtualCuda
    from tests.helpers import get_model

    monkeypatch.setattr(batching, "usable_memory", lambda model, device: 80 * GiB)
    model = get_model("tiny-llama3").model
    for p in model.parameters():
        setattr(p, TAG, 1)
    try:
        with VirtualCuda() as mode:
            yield model
        assert not mode.mixed
    finally:
        for p in model.parameters():
            delattr(p, TAG)


def _state(model, rows=(0, 0, 1, 1), budget=4):
    """A static decode state (`rows`: the prompt of each row)."""
    distinct = sorted(set(rows))
    return decode.Cascade(model, [PROMPTS[p] for p in distinct], [distinct.index(p) for p in rows], budget,
                          pad_id=0, token_budget=512, max_rows=8, static=True)


def test_the_step_graph_is_captured_on_the_models_device(on_cuda1, monkeypatch):
    """With cuda:0 current and the model on cuda:1, the warm-up and the capture run with cuda:1 current, the graph
    is made there, and the capture runs on a stream of cuda:1 passed to torch.cuda.graph (its default capture
    stream belongs to whichever device was current when it was first made)."""
    cuda = FakeCuda().install(monkeypatch)
    with torch.inference_mode():
        state = _state(on_cuda1)
        state.step()
        state.step(torch.tensor([1, 2, 3, 4], device=state.device))
    assert [c.current for c in cuda.captures] == [1]
    assert [g.device for g in cuda.graphs] == [1]
    assert cuda.captures[0].stream == torch.device("cuda", 1)
    assert cuda.current == 0  # the caller's device is current again
    assert state.graph_used and state.graph_error is None


def test_out_of_memory_during_capture_propagates(on_cuda1, monkeypatch):
    """A capture that runs out of memory raises out of the step, as an out-of-memory error, instead of leaving the
    batch to run eagerly at a size the device cannot hold."""
    FakeCuda(fail=lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")).install(monkeypatch)
    with torch.inference_mode():
        state = _state(on_cuda1)
        with pytest.raises(RuntimeError) as exc:
            state.step()
    assert batching.is_out_of_memory(exc.value)
    assert not state.graph_used


def test_out_of_memory_during_capture_halves_the_batch(on_cuda1, monkeypatch):
    """Through engine.batching.halving_on_oom (what generate runs each batch under): a capture out of memory at 4
    rows halves the batch, and each half of 2 rows decodes with its graph."""
    cuda = FakeCuda()
    sizes = []
    cuda.fail = lambda: torch.OutOfMemoryError("CUDA out of memory") if sizes[-1] > 2 else None
    cuda.install(monkeypatch)
    stats = SimpleNamespace(oom_splits=0)

    def run(rows):
        sizes.append(len(rows))
        with torch.inference_mode():
            state = _state(on_cuda1, rows=rows)
            state.step()
        return [state.graph_used]

    assert batching.halving_on_oom(run, [0, 0, 1, 1], lambda a, b: a + b, stats) == [True, True]
    assert sizes == [4, 2, 2] and stats.oom_splits == 1


def test_a_capture_error_leaves_the_steps_eager_and_unreported_as_graphs(on_cuda1, monkeypatch):
    """Any other error in a capture: the steps go on eagerly (a warning, `graph_error` set), and the state does not
    report `graph_used`, also when an earlier span's capture succeeded (own buffers doubling from 2 tokens here)."""
    monkeypatch.setattr(decode, "OWN_BLOCK", 2)
    error = RuntimeError("operation not permitted when stream is capturing")
    cuda = FakeCuda(fail=lambda: error if len(cuda.captures) > 1 else None).install(monkeypatch)
    with torch.inference_mode():
        state = _state(on_cuda1, budget=6)
        token = state.step().argmax(-1)
        assert state.graph_used
        token = state.step(token).argmax(-1)
        with pytest.warns(UserWarning, match="without a CUDA graph"):
            logits = state.step(token)  # the own buffers grow to 4 tokens: a new capture, which fails
        for _ in range(3):
            logits = state.step(logits.argmax(-1))
    assert len(cuda.captures) == 2  # no capture is tried again after one failed
    assert state.graph_error == "RuntimeError: operation not permitted when stream is capturing"
    assert not state.graph_used
    assert state.step_index == 6 and torch.isfinite(logits).all()


# -- key/value memory at Llama-3.1-8B's dimensions on an 80 GiB device ------------------------------------------

class _Param:
    """A bf16 weight on cuda:0 as far as the memory bounds ask (its size, its place; no storage)."""

    def __init__(self, *shape):
        self.shape, self.dtype, self.device = shape, torch.bfloat16, torch.device("cuda", 0)

    def numel(self):
        return math.prod(self.shape)

    def element_size(self):
        return 2


def _llama_8b():
    """Llama-3.1-8B's config and a stand-in model with its weights' shapes, in bf16 on cuda:0."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False)
    hidden, kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim
    layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden), (14336, hidden), (14336, hidden),
             (hidden, 14336), (hidden,), (hidden,)]
    embed, head = _Param(cfg.vocab_size, hidden), SimpleNamespace(weight=_Param(cfg.vocab_size, hidden), bias=None)
    params = [embed] + [_Param(*s) for _ in range(cfg.num_hidden_layers) for s in layer] + [_Param(hidden), head.weight]
    return SimpleNamespace(config=cfg, parameters=lambda: iter(params), get_input_embeddings=lambda: embed,
                           get_output_embeddings=lambda: head)


@pytest.fixture()
def h100(monkeypatch):
    """CUDA's device query answers as an 80 GiB H100 does."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=80 * GiB))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return torch.device("cuda", 0)


def _share_bytes(model, share):
    """`share` of the 80 GiB less the bf16 weights (about 8.03 billion parameters), the fp32 copy of the head the
    letter reads keep, and 1 GiB reserved for the CUDA context."""
    weights = 2 * sum(p.numel() for p in model.parameters())
    assert 8.0e9 < weights / 2 < 8.1e9
    head_copy = 4 * 128256 * 4096
    return share * (80 * GiB - weights - head_copy - GiB)


def test_usable_memory_leaves_out_the_fp32_head_and_the_context(h100):
    model = _llama_8b()
    assert batching.kv_bytes_per_token(model) == 2 * 32 * 8 * 128 * 2
    assert batching.usable_memory(model, h100) == _share_bytes(model, 1)
    assert batching.CUDA_CONTEXT_RESERVE == GiB


def test_generation_batches_hold_their_padded_buckets_within_half_the_usable_memory(h100):
    """Each batch `generate` forms, counted as its static decode state allocates it (each distinct prompt padded
    to the longest, every row of the power-of-two bucket with an own buffer of the longest budget), stays within
    half the usable memory: here 120 rows would fit unpadded, whose bucket of 128 would not."""
    model = _llama_8b()
    bounds = batch_bounds(model, h100)
    per_token = batching.kv_bytes_per_token(model)
    n, lengths, budgets = 5, [200] * 40, [2048] * 40
    batches = plan_batches(lengths, budgets, n, bounds)
    assert len(batches) > 1
    for batch in batches:
        members = [i for u in batch for i in u]
        allocated = len(members) * max(lengths[i] for i in members) + decode.bucket(n * len(members)) * max(budgets[i] for i in members)
        assert allocated * per_token <= _share_bytes(model, batching.GENERATION_CACHE_SHARE)


def test_the_cache_token_limit_is_the_memory_cap_below_the_budget(h100):
    """A token budget whose keys/values would take more than a quarter of the usable memory is cut to what a quarter
    holds; a sequence longer than that is refused with the sizes named, not run past the device's memory."""
    model = _llama_8b()
    per_token = batching.kv_bytes_per_token(model)
    cap = int(_share_bytes(model, 0.25)) // per_token
    assert batching.cache_token_limit(model, h100, 200_000) == cap
    assert batching.cache_token_limit(model, h100, 32768) == cap  # 4 x 32,768 tokens take more than a quarter
    assert batching.cache_token_limit(model, h100, 1024) == 4096
    assert batching.cache_token_limit(model, h100, 200_000, longest=cap) == cap
    from engine.errors import DeviceMemoryError

    with pytest.raises(DeviceMemoryError, match=f"{cap + 1:,} tokens"):
        batching.cache_token_limit(model, h100, 200_000, longest=cap + 1)


# -- a tuned lens trained after a bf16 model has read letters ---------------------------------------------------

def test_a_lens_trains_on_a_bf16_model_after_scoring():
    """Scoring reads letters under inference mode through the fp32 copy of the head it keeps; the lens trainer then
    uses that copy with autograd, and trains."""
    from engine.head import head_fp32
    from engine.loading import load_model
    from engine.scoring import score_ids
    from engine.tuned_lens import capture_streams, train_lens
    from tests.helpers import get_model

    letters = get_model("tiny-llama3").letters(("A", "B"))
    lm = load_model("tiny-llama3", device="cpu", dtype="bfloat16")
    score_ids(lm.model, PROMPTS, [letters, letters], pad_id=lm.pad_id)
    copy = head_fp32(lm.model)[0]
    lens, losses = train_lens(lm.model, capture_streams(lm.model, PROMPTS), steps=2, batch=8)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert lens.delta.abs().sum() > 0
    assert copy.dtype == torch.float32 and not copy.is_inference()
    assert head_fp32(lm.model)[0] is copy  # the same copy serves scoring and the lens
