"""Measure the judgment-action readouts while a model trains: a transformers `Trainer` with the readout callback
(docs/measuring-during-training.md). TRL's SFTTrainer and DPOTrainer are `Trainer`s, so the callback is added to them
the same way (`trainer.add_callback(...)`).

    .venv/bin/python examples/measure_during_training.py --model tiny-qwen2 --out runs/train-demo --steps 4 --every 2

Trains a LoRA adapter when peft is installed and `--lora` is given, else the full model; reads D, J0 and the
known-gap control at step 0 and every `--every` steps on `--limit` scenarios of `--panel`.
"""

from __future__ import annotations

import argparse
from importlib import resources

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

from engine.loading import locate
from engine.registry import resolve
from readouts.callback import ReadoutCallback


def texts() -> list[str]:
    """Training text: lines of the tiny models' corpus (put your own SFT data here)."""
    corpus = resources.files("engine").joinpath("data/tiny_corpus.txt").read_text()
    return [line for line in corpus.splitlines() if line.strip()][:64]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="alias or folder (readout models)")
    ap.add_argument("--out", required=True, help="the trainer's output folder (checkpoints, readouts/)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=10, help="read every N steps (and at step 0)")
    ap.add_argument("--panel", default="gap-v2")
    ap.add_argument("--limit", type=int, default=10, help="scenarios read per evaluation")
    ap.add_argument("--lora", action="store_true", help="train a LoRA adapter (peft) instead of every weight")
    args = ap.parse_args(argv)

    folder, _ = locate(resolve(args.model))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    # fp32, as `readout run` loads a model on CPU (the embedded SmolLM2 is stored in bf16); on a GPU train in bf16 and
    # compare with `readout run --dtype bfloat16`.
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    data = [{"input_ids": tokenizer(t, truncation=True, max_length=64)["input_ids"]} for t in texts()]

    def collate(batch):
        n = max(len(b["input_ids"]) for b in batch)
        ids = torch.tensor([b["input_ids"] + [0] * (n - len(b["input_ids"])) for b in batch])
        mask = torch.tensor([[1] * len(b["input_ids"]) + [0] * (n - len(b["input_ids"])) for b in batch])
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4, logging_steps=1,
                                 save_steps=args.every, report_to="none", learning_rate=1e-4)
    trainer = Trainer(model=model, args=training, train_dataset=data, data_collator=collate, processing_class=tokenizer)
    trainer.add_callback(ReadoutCallback(trainer, every=args.every, panel=args.panel, limit=args.limit))
    trainer.train()


if __name__ == "__main__":
    main()
