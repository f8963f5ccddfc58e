"""CPU decoding's linear layers on packed oneDNN weights (engine/packed.py): the same products as `F.linear`
within float rounding on every tiny family, used by `generate`, and the model left as it was."""

import pytest
import torch

import engine.packed as packed
from engine.generation import generate
from engine.packed import packed_linears
from tests.helpers import TINY


def linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


@pytest.mark.parametrize("name", TINY)
def test_packed_linears_equal_f_linear(models, name):
    lm = models(name)
    g = torch.Generator().manual_seed(0)
    vocab = lm.model.config.vocab_size
    with torch.inference_mode():
        for rows in (1, 9, 40):
            ids = torch.randint(3, vocab, (rows, 1), generator=g)
            plain = lm.model(input_ids=ids).logits
            with packed_linears(lm.model) as count:
                fast = lm.model(input_ids=ids).logits
            assert count == len(linears(lm.model))
            torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
        # More rows than PACKED_MAX_ROWS keep F.linear: bit for bit the same.
        ids = torch.randint(3, vocab, (packed.PACKED_MAX_ROWS + 1, 1), generator=g)
        plain = lm.model(input_ids=ids).logits
        with packed_linears(lm.model):
            assert torch.equal(lm.model(input_ids=ids).logits, plain)


def test_generate_decodes_on_packed_weights(models, monkeypatch):
    lm = models("tiny-qwen2")  # q/k/v with biases
    calls = []
    real = packed._linear
    monkeypatch.setattr(packed, "_linear", lambda x, p, b: calls.append(x.shape[0]) or real(x, p, b))
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    kw = dict(max_new_tokens=6, stop_ids=frozenset(), n=3, pad_id=lm.pad_id, greedy_first=True, temperature=0.7,
              top_p=0.95, seeds=[1, 2])
    fast = generate(lm.model, prompts, **kw)
    assert len(calls) >= 6 * len(linears(lm.model)) and max(calls) == 6  # each step, every layer, all 6 rows
    monkeypatch.setattr(packed, "PACKED_CPU_LINEARS", False)
    calls.clear()
    assert generate(lm.model, prompts, **kw) == fast and calls == []
    assert all("forward" not in m.__dict__ for m in linears(lm.model))


def test_the_model_is_left_as_it_was(models, monkeypatch):
    lm = models("tiny-llama3")
    mods = linears(lm.model)
    with pytest.raises(ValueError, match="inside"):
        with packed_linears(lm.model) as count:
            assert count == len(mods) and all("forward" in m.__dict__ for m in mods)
            raise ValueError("an error inside")
    assert all("forward" not in m.__dict__ for m in mods)
    # A layer with a forward of its own (a hook's wrapper) keeps it and is not packed.
    own = mods[0].forward
    mods[0].forward = own
    try:
        with packed_linears(lm.model) as count:
            assert count == len(mods) - 1 and mods[0].__dict__["forward"] is own
        assert mods[0].__dict__["forward"] is own
    finally:
        del mods[0].forward
    # Weights over the limit: nothing is packed.
    monkeypatch.setattr(packed, "PACK_LIMIT_BYTES", 1024)
    with packed_linears(lm.model) as count:
        assert count == 0 and all("forward" not in m.__dict__ for m in mods)
