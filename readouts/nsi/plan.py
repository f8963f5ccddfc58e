"""The framing-stability run's workload, stage by stage, as NsiRunner computes it (for `--plan`): every dilemma
in its four framings, tokenized with the model's own tokenizer; the replies decoded from those prompts (one
greedy and `samples` sampled rollouts each, to the reply budget), then the continuous read of each prompt
followed by the decision prefix.
"""

from __future__ import annotations

from contract.names import FRAMINGS
from engine.generation import BatchBounds, batch_shape, plan_batches
from engine.render import Prompt, encode_prompts
from panels.frames import render_polarity
from readouts.plan import StageWork, shared_tokens


def reply_label(n: int) -> str:
    """The replies' one `generate` call, as its batches are labelled in the plan and in the run's manifest."""
    return f"replies x{n}"


def nsi_workload(tok, chunks, profile, prefix_ids: tuple[int, ...], bounds: BatchBounds) -> list[StageWork]:
    """Per stage (replies, continuous), the run's workload over all `chunks` (lists of dilemmas); the replies'
    decoding batches as `generate` forms them under `bounds`."""
    replies, continuous = StageWork("replies"), StageWork("continuous")
    n = 1 + profile.samples
    for chunk in chunks:
        prompts = [Prompt(messages=render_polarity(d, f).messages) for d in chunk for f in FRAMINGS]
        seqs = [tuple(ids) for ids in encode_prompts(tok, prompts)]
        replies.prompts += len(seqs)
        replies.prompt_tokens += sum(map(len, seqs))
        replies.computed_tokens += shared_tokens(seqs)
        replies.rollouts += len(seqs) * n
        replies.generated_max += len(seqs) * n * profile.budget
        replies.reads += len(seqs) * n
        budgets = [profile.budget] * len(seqs)
        replies.requests.append([reply_label(n), n, [len(q) for q in seqs], budgets, [None] * len(seqs)])
        for batch in plan_batches([len(q) for q in seqs], budgets, n, bounds):
            replies.decode_batches.append([reply_label(n), *batch_shape(seqs, budgets, n, [i for u in batch for i in u])])
        reads = [s + tuple(prefix_ids) for s in seqs]
        continuous.prompts += len(reads)
        continuous.reads += len(reads)
        continuous.prompt_tokens += sum(map(len, reads))
        continuous.computed_tokens += shared_tokens(reads)
    return [replies, continuous]
