"""The judgment-action run's workload, stage by stage, as GapRunner would compute it (for `--plan`):
the same stages, seeded option orders, rendered frames and token budgets, tokenized with the model's own
tokenizer; generation prompts planned into prefix trees chunk by chunk as the decoder plans them.
"""

from __future__ import annotations

from contract.readouts import FIRST_TOKEN
from engine.render import encode_prompts
from panels.frames import render
from readouts.gap.profile import GapProfile, cells_read, rollouts
from readouts.gap.recipe import ANCHOR_ALLOWANCE, generation_jobs, orders_for, prompt_of, stages
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


def _generated(st: StageWork, tok, chunk, specs, profile: GapProfile, seed: int) -> None:
    planned = generation_jobs(chunk, specs, profile, seed)
    jobs = [(sp.name, getattr(profile, sp.budget), rollouts(sp, profile)) for _, _, sp, _, _, _ in planned]
    prompts = [prompt_of(rendered) for *_, rendered in planned]
    if not jobs:
        return
    seqs = [tuple(ids) for ids in encode_prompts(tok, prompts)]
    rows = sum(n for _, _, n in jobs)
    st.prompts += len(jobs)
    st.prompt_tokens += sum(map(len, seqs))
    st.computed_tokens += shared_tokens(seqs)
    st.rollouts += rows
    st.generated_max += sum(n * b for _, b, n in jobs)
    derived = [sp for sp in specs if sp.derived_from is not None]
    reads = rows + sum(sum(n for name, _, n in jobs if name == sp.derived_from) for sp in derived)
    st.reads += reads
    longest = max(b for _, b, _ in jobs)
    st.reread_tokens_max += reads * (longest + ANCHOR_ALLOWANCE)
    st.decode_batches.append((rows, sum(len(p) for p in dict.fromkeys(seqs)), longest))


def gap_workload(tok, chunks, profile: GapProfile, groups, seed: int) -> list[StageWork]:
    """Per stage, the run's workload over all `chunks` (lists of scenarios)."""
    out: dict[str, StageWork] = {}
    for chunk in chunks:
        for name, specs in stages(groups, profile):
            st = out.setdefault(name, StageWork(name))
            if specs[0].read == FIRST_TOKEN:
                _first_token(st, tok, chunk, specs[0], profile, seed)
            else:
                _generated(st, tok, chunk, specs, profile, seed)
    return list(out.values())
