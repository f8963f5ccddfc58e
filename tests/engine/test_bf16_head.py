"""Letters read from a bf16 model: the head is applied in fp32 at the read positions, which keeps the option
masses within the documented tolerance of the fp32 model's; with the head in bf16 (the model's own logits)
they move several times further (on the embedded model, 8 two- and three-option prompts: fp32 head mean 0.002,
max 0.007; bf16 head mean 0.007, max 0.021)."""

import copy

import torch

from engine.head import head_fp32
from engine.render import Prompt, encode_prompt
from engine.scoring import HEAD_FP32_TOLERANCE, letter_masses, score_ids
from tests.helpers import get_model

QUESTIONS = [
    "You find a wallet with $200. A) Return it to the owner B) Keep the money. Answer with the letter only.",
    "Your friend asks you to lie for them. A) Tell the truth B) Lie. Answer with the letter only.",
    "A cashier gives you too much change. A) Point out the mistake B) Keep the extra. Answer with the letter only.",
    "You can skip a safety check to finish early. A) Do the check B) Skip it C) Ask a manager. Answer with the letter only.",
    "Which is the capital of France? A) Paris B) Rome C) Madrid. Answer with the letter only.",
]


def option_masses(rows):
    return torch.tensor([r.option_mass for r in rows])


def letter_heavy(lm, seqs, letters):
    """A copy of the tiny model whose untied head puts its letters near logit 20 (most of the mass, letters
    apart by about one logit): the regime of a real model at its answer letters, where bf16 logits move in
    steps of 0.125."""
    model = copy.deepcopy(lm.model)
    with torch.no_grad():
        u = torch.stack([model.model(input_ids=torch.tensor([s])).last_hidden_state[0, -1] for s in seqs]).mean(0)
        weight = model.get_output_embeddings().weight.detach().clone()
        noise = torch.Generator().manual_seed(0)
        for ids in letters.token_ids:
            for i in ids:
                weight[i] = u * (20.0 / float(u @ u)) + torch.randn(u.shape, generator=noise) / float(u.norm())
        head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        head.weight = torch.nn.Parameter(weight)
    model.set_output_embeddings(head)
    model.config.tie_word_embeddings = False
    return model


def test_bf16_read_positions_use_an_fp32_head():
    lm = get_model("tiny-llama3")
    seqs = [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": q},))) for q in QUESTIONS]
    letters = [lm.letters("ABC")] * len(seqs)
    fp32 = letter_heavy(lm, seqs, letters[0])
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    ref = score_ids(fp32, seqs, letters, pad_id=lm.pad_id)
    assert min(r.letter_mass for r in ref) > 0.5  # letters carry the mass: the comparison has teeth
    ours = score_ids(bf16, seqs, letters, pad_id=lm.pad_id)
    with torch.inference_mode():
        own = torch.stack([bf16(input_ids=torch.tensor([s])).logits[0, -1] for s in seqs])
    bf16_head = letter_masses(own, letters, [len(s) for s in seqs], 1.0, 1.0)
    fp32_head_error = (option_masses(ours) - option_masses(ref)).abs()
    bf16_head_error = (option_masses(bf16_head) - option_masses(ref)).abs()
    assert float(fp32_head_error.max()) <= HEAD_FP32_TOLERANCE
    assert float(fp32_head_error.mean()) < 0.5 * float(bf16_head_error.mean())


def test_the_fp32_head_is_kept_once_and_follows_the_weights():
    lm = get_model("tiny-llama3")
    assert head_fp32(lm.model)[0] is lm.model.get_output_embeddings().weight  # an fp32 model reads its own head
    bf16 = copy.deepcopy(lm.model).to(torch.bfloat16)
    first = head_fp32(bf16)[0]
    assert first.dtype == torch.float32 and torch.equal(first, bf16.get_output_embeddings().weight.float())
    assert head_fp32(bf16)[0] is first
    with torch.no_grad():
        bf16.get_output_embeddings().weight.mul_(2.0)  # written in place (e.g. a merged adapter)
    again = head_fp32(bf16)[0]
    assert again is not first and torch.equal(again, bf16.get_output_embeddings().weight.float())
