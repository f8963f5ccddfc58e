"""Running out of memory in the middle of decoding: the batch is halved and retried, the retry holds nothing
of the failed batch (its prompt caches are published only once a batch succeeds; its key/value buffers are
freed before either half allocates), and the result equals an undisturbed run's."""

import weakref

import torch

import engine.decode as decode
from engine.generation import generate
from engine.render import Prompt, encode_prompt
from tests.helpers import get_model

QUESTIONS = ["Say hello.", "Pick one: A) stay B) go", "List three colours.", "Which is right, A or B? Explain briefly."]


def test_out_of_memory_mid_decode_leaves_nothing_for_the_retry(monkeypatch):
    lm = get_model("tiny-llama3")
    ps = [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": q},))) for q in QUESTIONS]
    kw = dict(max_new_tokens=6, stop_ids=frozenset(), n=2, temperature=0.9, seeds=[1, 2, 3, 4], pad_id=lm.pad_id, max_rows=16)
    clean_kv: dict = {}
    clean = generate(lm.model, ps, prefix_kv=clean_kv, **kw)

    kv: dict = {}
    held_at_start = []  # prompt caches already published when each batch starts decoding
    failed = []
    step, init = decode.Cascade.step, decode.Cascade.__init__

    failed_buffers: list = []  # weak references to the failed batch's key/value buffers
    failed_held = []  # bytes of them still alive when each retry starts (the retry's peak over its own)

    def counting_init(self, model, prompts, *args, **kwargs):
        held_at_start.append((len(prompts), len(kv)))
        if failed_buffers:
            failed_held.append(sum(t.numel() * t.element_size() for t in (r() for r in failed_buffers) if t is not None))
        init(self, model, prompts, *args, **kwargs)

    def failing_step(self, tokens=None):
        if len(self.prompts) == len(ps) and self.step_index == 3 and not failed:
            failed.append(True)
            failed_buffers.extend(weakref.ref(t) for t in (*self.ks, *self.vs, *self.kp, *self.vp))
            raise torch.OutOfMemoryError("CUDA out of memory (injected mid-decode)")
        return step(self, tokens)

    monkeypatch.setattr(decode.Cascade, "__init__", counting_init)
    monkeypatch.setattr(decode.Cascade, "step", failing_step)
    out = generate(lm.model, ps, prefix_kv=kv, **kw)
    assert failed and out == clean
    assert held_at_start == [(4, 0), (2, 0), (2, 2)]  # the first half's retry starts with nothing published
    # ... and with the failed batch's caches freed: none of their bytes is alive when either half allocates
    assert len(failed_buffers) >= 2 * lm.model.config.num_hidden_layers and failed_held == [0, 0]
    assert set(kv) == set(clean_kv)
    for key, layers in kv.items():
        for (k, v), (k0, v0) in zip(layers, clean_kv[key]):
            assert torch.allclose(k, k0, atol=1e-5) and torch.allclose(v, v0, atol=1e-5)  # batch shapes differ
