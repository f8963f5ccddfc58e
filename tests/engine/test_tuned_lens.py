"""The tuned lens (engine/tuned_lens.py) against references computed here: the captured streams against
transformers' `output_hidden_states`, the translated distribution and its KL against numpy/scipy on the plain
forward's states and the trainer against a planted translator it must recover; on every tiny family (SmolLM2 too for the
capture and the KL; tests/readouts/gap/test_lens_run.py trains one on SmolLM2 and compares it on held-out text)."""

import numpy as np
import pytest
import torch
from scipy.special import log_softmax, rel_entr

from engine.errors import ReadoutError
from engine.residuals import n_depths
from engine.tuned_lens import TunedLens, capture_streams, kl_to_final, train_lens
from tests.helpers import SMOLLM2, TINY, get_model

SEQS = ([5, 17, 9, 33, 2, 41, 8], [12, 3, 3, 29, 40, 7, 21, 16, 5])


def _hidden_states(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True, use_cache=False)


def _random_lens(model, seed=0, scale=0.05) -> TunedLens:
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    return TunedLens(scale * torch.randn(cfg.num_hidden_layers, cfg.hidden_size, cfg.hidden_size, generator=g),
                     scale * torch.randn(cfg.num_hidden_layers, cfg.hidden_size, generator=g))


def _head_np(model, h: np.ndarray) -> np.ndarray:
    """Final norm (the model's module) then the head, as numpy log-probabilities."""
    with torch.inference_mode():
        normed = model.base_model.norm(torch.tensor(h, dtype=torch.float32)).double().numpy()
    w = model.get_output_embeddings().weight.detach().double().numpy()
    return log_softmax(normed @ w.T, axis=-1)


@pytest.mark.parametrize("name", [*TINY, SMOLLM2])
def test_streams_and_kl_equal_a_plain_forward_by_hand(name):
    lm = get_model(name)
    model = lm.model
    seqs = [[t % model.config.vocab_size for t in s] for s in SEQS]
    streams = capture_streams(model, seqs)
    L = model.config.num_hidden_layers
    assert streams.shape == (sum(map(len, seqs)), L + 1, model.config.hidden_size)
    lens = _random_lens(model)
    kl_logit, kl_tuned = kl_to_final(model, streams), kl_to_final(model, streams, lens)
    row = 0
    for ids in seqs:
        out = _hidden_states(model, ids)
        ref = torch.stack([h[0].float() for h in out.hidden_states], dim=1)  # [tokens, depths, hidden]
        got = streams[row : row + len(ids)]
        scale = ref[:, :L].abs().amax(-1, keepdim=True).clamp(min=1.0)
        assert ((got[:, :L] - ref[:, :L]).abs() / scale).max() < 1e-5  # hidden_states[L] is already normed
        final = log_softmax(out.logits[0].double().numpy(), axis=-1)  # the model's own next-token distribution
        h = got.double().numpy()
        for d in range(L + 1):
            moved = h[:, d] if d == L else h[:, d] + h[:, d] @ lens.delta[d].double().numpy().T + lens.bias[d].double().numpy()
            for lensed, kl in ((_head_np(model, h[:, d]), kl_logit), (_head_np(model, moved), kl_tuned)):
                want = rel_entr(np.exp(final), np.exp(lensed)).sum(-1)  # KL(final || lens)
                np.testing.assert_allclose(kl[row : row + len(ids), d].numpy(), want, atol=2e-4, rtol=1e-3)
        row += len(ids)
    assert kl_logit[:, L].abs().max() < 1e-4 and kl_tuned[:, L].abs().max() < 1e-4


def _planted_streams(model, lens: TunedLens, n: int, seed: int) -> torch.Tensor:
    """Streams whose every depth d < L maps to the last depth's stream exactly through the planted translator:
    h_d = (I + A_d)^-1 (h_L - b_d), h_L standard normal (the final norm takes out its scale)."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    last = torch.randn(n, cfg.hidden_size, generator=g)
    eye = torch.eye(cfg.hidden_size)
    depths = [torch.linalg.solve(eye + lens.delta[d], (last - lens.bias[d]).T).T for d in range(cfg.num_hidden_layers)]
    return torch.stack([*depths, last], dim=1)


@pytest.mark.parametrize("name", TINY)
def test_training_recovers_a_planted_translator(name):
    model = get_model(name).model
    planted = _random_lens(model, seed=1, scale=0.6 / model.config.hidden_size**0.5)
    train, held = _planted_streams(model, planted, 512, 0), _planted_streams(model, planted, 128, 1)
    kl_before = kl_to_final(model, held).mean(0)[:-1]
    lens, losses = train_lens(model, train, steps=600, lr=1e-2, batch=64, seed=0)
    kl_after = kl_to_final(model, held, lens).mean(0)[:-1]
    assert kl_to_final(model, held, planted).abs().max() < 1e-4  # the planted lens is exact by construction
    assert (kl_before > 0.05).all(), kl_before
    assert (kl_after < 0.1 * kl_before).all(), (kl_before, kl_after)
    assert losses[-1] < 0.1 * losses[0]


def test_training_is_seeded_and_leaves_the_model_as_it_was():
    model = get_model("tiny-qwen2").model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    streams = capture_streams(model, SEQS)
    a, la = train_lens(model, streams, steps=5, seed=3)
    b, lb = train_lens(model, streams, steps=5, seed=3)
    c, _ = train_lens(model, streams, steps=5, seed=4)
    assert la == lb and torch.equal(a.delta, b.delta) and not torch.equal(a.delta, c.delta)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(not p.requires_grad or p.requires_grad for p in model.parameters())


@pytest.mark.smollm
def test_a_lens_file_round_trips_and_refuses_another_model(tmp_path):
    model = get_model("tiny-llama3").model
    lens = _random_lens(model)
    lens.meta = {"model": {"name": "tiny-llama3", "adapter": None}}
    path = lens.save(tmp_path / "lens.safetensors")
    back = TunedLens.load(path)
    assert torch.equal(back.delta, lens.delta) and torch.equal(back.bias, lens.bias)
    assert back.meta["model"] == lens.meta["model"]
    back.check_fits(model, {"name": "tiny-llama3", "adapter": None}, path)
    with pytest.raises(ReadoutError, match=r"lens.safetensors: model.adapter is None, this run's is 'abc'"):
        back.check_fits(model, {"name": "tiny-llama3", "adapter": "abc"}, path)
    other = get_model("smollm2-135m").model
    with pytest.raises(ReadoutError, match=r"lens.safetensors: \d+ layers x \d+ hidden, the model has 30 x 576"):
        back.check_fits(other, {"name": "tiny-llama3", "adapter": None}, path)
    (tmp_path / "junk.safetensors").write_bytes(b"not a lens")
    with pytest.raises(ReadoutError, match="junk.safetensors: not a tuned-lens file"):
        TunedLens.load(tmp_path / "junk.safetensors")
    with pytest.raises(ReadoutError, match="missing.safetensors: no such file"):
        TunedLens.load(tmp_path / "missing.safetensors")
    assert n_depths(model) == lens.layers + 1


def test_a_model_that_scales_its_logits_is_refused_by_the_lens(monkeypatch):
    from engine.residuals import lens_logits

    model = get_model("tiny-llama3").model
    streams = capture_streams(model, SEQS[:1])
    monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
    with pytest.raises(ReadoutError, match="sets final_logit_softcapping=30.0: a lens's norm and head would not be"):
        lens_logits(model, streams)


def test_the_training_loss_is_the_forward_kl_summed_over_depths():
    """At step 0 (translators at zero) the loss is the logit lens's KL(final || lens) summed over depths 0..L-1 and
    averaged over the step's positions (the generator's first draw); the reverse KL gives another number."""
    model = get_model("tiny-qwen2").model
    streams = capture_streams(model, SEQS)
    _, losses = train_lens(model, streams, steps=1, batch=4, seed=5)
    idx = torch.randint(0, streams.shape[0], (4,), generator=torch.Generator().manual_seed(5))
    h = streams[idx].double().numpy()
    final = _head_np(model, h[:, -1])
    forward = np.mean([sum(rel_entr(np.exp(final[i]), np.exp(_head_np(model, h[i, d]))).sum()
                           for d in range(h.shape[1] - 1)) for i in range(4)])
    reverse = np.mean([sum(rel_entr(np.exp(_head_np(model, h[i, d])), np.exp(final[i])).sum()
                           for d in range(h.shape[1] - 1)) for i in range(4)])
    assert losses[0] == pytest.approx(forward, rel=1e-4)
    assert abs(forward - reverse) > 1e-2 * forward
