"""A real transformers `Trainer` on a tiny model, for the tests of the training callback and of `readout watch`: a few
steps of causal-LM training on lines of the tiny models' corpus, with dropout on (so the random stream matters)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

EVAL_SET = ("orders.D=2", "orders.J0=2", "orders.control=2")
"""Profile overrides that keep each evaluation small (quick profile, two option orders per readout)."""
EVAL_LIMIT = 2
"""Scenarios read per evaluation."""


def corpus_lines(n: int = 64) -> list[str]:
    text = resources.files("engine").joinpath("data/tiny_corpus.txt").read_text()
    return [line for line in text.splitlines() if line.strip()][:n]


class LineData:
    """Token ids of each corpus line (labels = inputs), a map-style dataset."""

    def __init__(self, tokenizer, n: int = 64, length: int = 32):
        self.items = [tokenizer(t, truncation=True, max_length=length)["input_ids"] for t in corpus_lines(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i]}


def collate(batch):
    import torch

    n = max(len(b["input_ids"]) for b in batch)
    ids = torch.tensor([b["input_ids"] + [0] * (n - len(b["input_ids"])) for b in batch])
    mask = torch.tensor([[1] * len(b["input_ids"]) + [0] * (n - len(b["input_ids"])) for b in batch])
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def tiny_model(name: str = "tiny-qwen2", dropout: float = 0.2):
    """(model, tokenizer, folder) of a tiny family, its attention dropout set to `dropout`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.tiny import ensure_tiny

    folder = ensure_tiny(name)
    return AutoModelForCausalLM.from_pretrained(folder, attention_dropout=dropout), AutoTokenizer.from_pretrained(folder), folder


def make_trainer(model, tokenizer, out: Path, *, steps: int, save_steps: int, seed: int = 3, callbacks=(), lr: float = 1e-2):
    """A Trainer on CPU that logs the loss every step and saves the model (weights and tokenizer) every `save_steps`."""
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
                             save_steps=save_steps, save_only_model=True, report_to="none", use_cpu=True,
                             learning_rate=lr, seed=seed, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=LineData(tokenizer), data_collator=collate,
                      processing_class=tokenizer)
    for cb in callbacks:
        trainer.add_callback(cb)
    return trainer


def losses(trainer) -> list[float]:
    """The training loss logged at each step."""
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]

