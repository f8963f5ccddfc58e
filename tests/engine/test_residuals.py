"""Residual capture and activation patching (engine/residuals.py) equal a plain forward: captures against
`output_hidden_states=True`, patches against a hook written here, in fp32 within 1e-5, through the prefix tree and
batching, on every tiny family and on SmolLM2."""

import pytest
import torch

from engine.letters import LetterTokens
from engine.residuals import Patch, lens_logits, n_depths, patched_logits
from engine.scoring import letter_masses, plain_next_token_logits, score_ids
from tests.helpers import TINY, probe_set

TOL = 1e-5


def reference_states(model, ids) -> torch.Tensor:
    """[depths, hidden] at the last token from transformers' own hidden states. Its last entry is the final norm's
    output, so the last depth is compared after the model's norm."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True, use_cache=False)
    return torch.stack([h[0, -1].float() for h in out.hidden_states])


CONFIGS = (dict(fast=False), dict(max_batch=3), dict(max_batch=64, min_prefix=4))
"""The plain path, small batches through the prefix tree, one wide batch with deep nesting."""


def check_capture(lm, seqs, letters, configs=CONFIGS):
    model = lm.model
    refs = [reference_states(model, s) for s in seqs]
    norm = model.base_model.norm
    for kwargs in configs:
        out = score_ids(model, seqs, letters, residuals=True, **kwargs)
        plain = score_ids(model, seqs, letters, **kwargs)
        for r, p, ref in zip(out, plain, refs):
            got = r.residuals
            assert got.shape == (n_depths(model), model.config.hidden_size)
            # fp32 within 1e-5 of the stream's own scale (SmolLM2's stream reaches ~600 at the read position).
            scale = ref.abs().amax(1, keepdim=True).clamp(min=1.0)
            assert ((got[:-1] - ref[:-1]).abs() / scale[:-1]).max() < TOL, kwargs
            with torch.inference_mode():
                assert (norm(got[-1]) - ref[-1]).abs().max() / scale[-1] < TOL, kwargs
            # The capture does not change the read.
            assert max(abs(a - b) for a, b in zip(r.mass, p.mass)) < TOL
        # The logit lens at the last depth is the ordinary read.
        last = lens_logits(model, torch.stack([r.residuals[-1] for r in out]))
        lensed = letter_masses(last, letters, [len(s) for s in seqs], 1.0, 1.0)
        assert max(abs(a - b) for x, y in zip(lensed, out) for a, b in zip(x.mass, y.mass)) < TOL


def hooked_logits(model, ids, depth, position, vector) -> torch.Tensor:
    """A plain forward with the stream at (depth, position) replaced, by a hook written independently of the
    engine's: depth 0 through the embeddings' output, depth i through layer i's output."""
    def write(h):
        h = h.clone()
        h[0, position] = vector
        return h

    if depth == 0:
        handle = model.get_input_embeddings().register_forward_hook(lambda m, a, out: write(out))
    else:
        layer = model.base_model.layers[depth - 1]
        handle = layer.register_forward_hook(
            lambda m, a, out: (write(out[0]), *out[1:]) if isinstance(out, tuple) else write(out))
    try:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0].float()
    finally:
        handle.remove()


def check_patches(lm, seqs, letters, configs=CONFIGS):
    model = lm.model
    gen = torch.Generator().manual_seed(3)
    depths = n_depths(model)
    patches = [None if i % 4 == 3 else Patch(i % depths, torch.randn(model.config.hidden_size, generator=gen) * 3)
               for i in range(len(seqs))]
    refs = []
    for s, lt, p in zip(seqs, letters, patches):
        logits = plain_next_token_logits(model, s) if p is None else hooked_logits(model, s, p.depth, len(s) - 1, p.vector)[-1]
        refs.append(letter_masses(logits[None], [lt], [len(s)], 0.7, 1.0)[0])
    for kwargs in configs:
        out = score_ids(model, seqs, letters, patches=patches, temperature=0.7, **kwargs)
        for r, ref, p in zip(out, refs, patches):
            assert max(abs(a - b) for a, b in zip(r.mass + r.tempered, ref.mass + ref.tempered)) < TOL, (kwargs, p and p.depth)
    # The patches move the read (the test can tell a patch that was not applied).
    unpatched = score_ids(model, seqs, letters, temperature=0.7)
    moved = [max(abs(a - b) for a, b in zip(x.option_mass, y.option_mass)) for x, y, p in zip(unpatched, refs, patches) if p is not None]
    assert min(moved) > 1e-3
    # Any position, through the reference primitive.
    s = seqs[0]
    for depth in (0, depths // 2, depths - 1):
        v = torch.randn(model.config.hidden_size, generator=gen)
        want = hooked_logits(model, s, depth, len(s) // 2, v)
        got = patched_logits(model, s, Patch(depth, v, position=len(s) // 2))
        assert (got - want).abs().max() < TOL * 10  # full-vocab logits (not probabilities)


@pytest.mark.parametrize("name", TINY)
def test_capture_equals_hidden_states_tiny(name):
    lm, seqs, letters = probe_set(name, n_scenarios=2, orders=4)
    check_capture(lm, seqs, letters)


@pytest.mark.parametrize("name", TINY)
def test_patch_equals_a_manual_hook_tiny(name):
    lm, seqs, letters = probe_set(name, n_scenarios=2, orders=4)
    check_patches(lm, seqs, letters)


@pytest.mark.smollm
def test_capture_and_patch_on_smollm2():
    lm, seqs, letters = probe_set("smollm2-135m", n_scenarios=1, orders=2, seed=1)
    check_capture(lm, seqs, letters, CONFIGS[1:2])
    check_patches(lm, seqs, letters, CONFIGS[1:2])


def test_patch_away_from_the_read_position_is_refused():
    from engine.errors import ProbeInputError
    from tests.helpers import get_model

    lm = get_model("tiny-qwen2")
    with pytest.raises(ProbeInputError, match="read position"):
        score_ids(lm.model, [[5, 6, 7]], [LetterTokens(("A",), ((32,),), (("A",),))], patches=[Patch(1, torch.zeros(64), position=0)])
