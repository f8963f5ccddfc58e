"""A model spread over two GPUs (`device_map`), mocked on CPU (tests/engine/virtual_devices.py: tensors on
cuda:0 and cuda:1 are tagged CPU tensors, and mixing them fails as on CUDA): the letter readout reads the
right positions (index tensors follow the hidden states to the last device), generation decodes (the
fallback decoder, its logits brought back to the inputs' device), and both equal the unplaced model."""

import pytest

import engine.batching as batching
import engine.scoring as scoring
from engine.decode import supports_cascade
from engine.generation import generate
from tests.engine.virtual_devices import placed
from tests.helpers import max_diff, probe_set


@pytest.fixture(autouse=True)
def gpu_memory(monkeypatch):
    """The one hardware query the mock cannot answer: a GPU's memory (80 GiB less the weights, say)."""
    monkeypatch.setattr(batching, "usable_memory", lambda model, device: 80 << 30)


@pytest.mark.parametrize("plain_head", [True, False])
@pytest.mark.parametrize("name", ["tiny-llama3", "tiny-qwen2"])
def test_letter_readout_under_a_two_device_map(name, plain_head, monkeypatch):
    lm, seqs, letters = probe_set(name, n_scenarios=2, orders=3)
    if not plain_head:  # the path that asks the model for logits at the read positions (logits_to_keep)
        monkeypatch.setattr(scoring, "_plain_head", lambda model: False)
    ref = scoring.score_ids(lm.model, seqs, letters, fast=False, pad_id=lm.pad_id)
    with placed(lm.model, split=1) as mode:
        assert str(lm.model.get_input_embeddings().weight.device) == "cuda:0"
        out = scoring.score_ids(lm.model, seqs, letters, pad_id=lm.pad_id, max_batch=4)
    assert not mode.mixed
    assert max_diff(ref, out) < 1e-5


def test_generation_under_a_two_device_map():
    """Rollouts as on one device; the prompt caches it publishes (layers on both devices) serve the re-read
    of prompt + rollout, as the J readout's anchor read uses them."""
    lm, seqs, letters = probe_set("tiny-llama3", n_scenarios=2, orders=2)
    kw = dict(max_new_tokens=6, stop_ids=frozenset({lm.tokenizer.eos_token_id}), n=3, temperature=0.8, top_p=0.95,
              seeds=list(range(len(seqs))), pad_id=lm.pad_id, greedy_first=True)
    ref = generate(lm.model, seqs, **kw)
    reread = [s + list(r[1].tokens) for s, r in zip(seqs, ref)]
    ref_read = scoring.score_ids(lm.model, reread, letters[: len(seqs)], fast=False, pad_id=lm.pad_id)
    with placed(lm.model, split=1) as mode:
        assert not supports_cascade(lm.model)  # its caches live on one device: spread models use the fallback
        kv: dict = {}
        out = generate(lm.model, seqs, compact=True, prefix_kv=kv, **kw)
        stats = scoring.ScoreStats()
        read = scoring.score_ids(lm.model, reread, letters[: len(seqs)], pad_id=lm.pad_id, known_prefixes=kv, stats=stats)
    assert not mode.mixed
    assert out == ref
    assert stats.computed_tokens < stats.prompt_tokens  # the published prompt caches were used
    assert max_diff(ref_read, read) < 1e-5
