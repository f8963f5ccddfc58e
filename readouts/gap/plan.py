"""The judgment-action run's workload, stage by stage, as GapRunner would compute it (for `--plan`):
the same stages, seeded option orders, rendered frames and token budgets, tokenized with the model's own
tokenizer; generation prompts planned into prefix trees window by window (the chunks a run decodes
together) as the decoder plans them.
"""

from __future__ import annotations

from contract.readouts import FIRST_TOKEN
from engine.generation import BatchBounds, batch_shape, plan_batches
from engine.render import encode_prompts
from panels.frames import render
from readouts.gap.profile import GapProfile, cells_read
from readouts.gap.prompts import prompt_of
from readouts.gap.recipe import ANCHOR_ALLOWANCE, generation_calls, generation_jobs, orders_for, stages
from readouts.plan import StageWork, shared_tokens


def _first_token(st: StageWork, tok, chunk, spec, profile: GapProfile, seed: int) -> None:
    """A first-token readout reads each scenario cell in every option order. Its orders differ only in the
    option lines, so two orders are tokenized: the first one's length stands for every order (a permutation
    of the same lines: a token or two apart at most), and what they share before the options is counted
    once per cell, as the prefix tree runs it (sharing across cells, the template header, is left out)."""
    (frame,) = spec.frames
    cells, prompts = [], []
    for s in chunk:
        orders = orders_for(s, spec, profile, seed)
        for cell in (c for c in cells_read(s, profile) if spec.reads_cell(c)):
            cells.append(len(orders))
            prompts += [prompt_of(render(s, frame, cell, order, profile.frames)) for order in (orders * 2)[:2]]
    ids = encode_prompts(tok, prompts)
    for n_orders, first, second in zip(cells, ids[0::2], ids[1::2]):
        shared = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))
        shared = min(shared, len(first) - 1)
        st.prompts += n_orders
        st.reads += n_orders
        st.prompt_tokens += len(first) * n_orders
        st.computed_tokens += shared + (len(first) - shared) * n_orders


def _generated(st: StageWork, tok, chunk, specs, profile: GapProfile, seed: int, bounds: BatchBounds) -> None:
    planned = generation_jobs(chunk, specs, profile, seed)
    if not planned:
        return
    # Reads per row: its own and one for each readout derived from its readout (a cut of its text).
    per_row = {job[2].name: 1 + sum(sp.derived_from == job[2].name for sp in specs) for job in planned}
    for label, n, part, ties in generation_calls(planned, profile):
        seqs = [tuple(ids) for ids in encode_prompts(tok, [prompt_of(job[5]) for job in part])]
        budgets = [getattr(profile, job[2].budget) for job in part]
        st.prompts += len(part)
        st.prompt_tokens += sum(map(len, seqs))
        st.computed_tokens += shared_tokens(seqs)
        st.rollouts += len(part) * n
        st.generated_max += n * sum(budgets)
        st.requests.append([label, n, [len(q) for q in seqs], budgets, list(ties)])
        st.reread_tokens_drawn += shared_tokens(seqs) + sum(
            n * per_row[job[2].name] * (b + ANCHOR_ALLOWANCE) for job, b in zip(part, budgets))
        for batch in plan_batches([len(q) for q in seqs], budgets, n, bounds, ties):
            room = bounds.row_cache_bytes  # the rows' caches of one batch, read and let go before the next decodes
            members = [i for u in batch for i in u]
            st.decode_batches.append([label, *batch_shape(seqs, budgets, n, members)])
            for i in members:  # rows are held as their batch finishes, in batch order, while the room lasts
                reads, size = per_row[part[i][2].name], budgets[i] * bounds.kv_bytes_per_token
                for _ in range(n):
                    st.reads += reads
                    if room is None or size <= room:
                        room = None if room is None else room - size
                        st.reread_tokens_max += reads * ANCHOR_ALLOWANCE
                    else:
                        st.reread_tokens_max += reads * (budgets[i] + ANCHOR_ALLOWANCE)


def gap_workload(tok, chunks, profile: GapProfile, groups, seed: int, bounds: BatchBounds) -> list[StageWork]:
    """Per stage, the run's workload over all `chunks` (lists of scenarios: each the records of one window, which
    the run computes together); decoding batches as `generate` forms them under `bounds` (the run's device, or the
    GPU planned for)."""
    out: dict[str, StageWork] = {}
    for chunk in chunks:
        for name, specs in stages(groups, profile):
            st = out.setdefault(name, StageWork(name))
            if specs[0].read == FIRST_TOKEN:
                _first_token(st, tok, chunk, specs[0], profile, seed)
            else:
                _generated(st, tok, chunk, specs, profile, seed, bounds)
    return list(out.values())
