"""The judgment-action run's workload, stage by stage, as GapRunner would compute it (for `--plan`):
the same stages, seeded option orders, rendered frames and token budgets, tokenized with the model's own
tokenizer; generation prompts planned into prefix trees window by window (the chunks a run decodes
together) as the decoder plans them. A depth run (`--readouts ...,depth`) adds a `depth` stage: the forward passes
its patching makes beyond the reads (the logit and tuned lens read the reads' own residuals, at no cost).
"""

from __future__ import annotations

from contract.names import DEPTH_CELLS, PATCH_GROUPS, PATCH_PAIRS
from contract.readouts import FIRST_TOKEN
from engine.generation import BatchBounds, batch_shape, plan_batches
from engine.render import encode_prompts
from panels.frames import render
from readouts.gap.depth import JUDGE_FRAME, foreign_partner, patch_depths
from readouts.gap.profile import GapProfile, cells_read
from readouts.gap.prompts import prompt_of
from readouts.gap.recipe import ANCHOR_ALLOWANCE, generation_calls, generation_jobs, orders_for, stages
from readouts.gap.span_patch import AGENT_FRAME, filler_partner, pair_prompts
from readouts.plan import StageWork, shared_tokens

DEPTH_STAGE = "depth"
"""The plan's stage of a depth run's patching forwards."""


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


def _patch_plan(chunk, spec, profile: GapProfile, seed: int, layers: int) -> tuple[list, list]:
    """The forward passes readouts.gap.depth.patch_rows makes for one chunk: (each primary agent read of D's first
    `patch_orders` orders, rendered, with how many patched forwards it gets: one per patched depth from each source it
    has), and each patch source's own read (the letter-only judge of the scenario and of its foreign partner, the
    partner's agent prompt; the twin's read is the run's own), rendered."""
    if profile.patch_stride < 1:
        return [], []
    depths, sources, agents = patch_depths(layers, profile.patch_stride), {}, []
    for s in chunk:
        cells = [c for c in cells_read(s, profile) if spec.reads_cell(c)]
        if DEPTH_CELLS[0] not in cells:
            continue
        partner = foreign_partner(chunk, s)
        for order in orders_for(s, spec, profile, seed)[: profile.patch_orders]:
            for source, frame in ((s, JUDGE_FRAME), (partner, JUDGE_FRAME), (partner, AGENT_FRAME)):
                if source is not None:
                    sources[(source.id, frame, order)] = render(source, frame, DEPTH_CELLS[0], order, profile.frames)
            n = 1 + (DEPTH_CELLS[1] in cells) + 2 * (partner is not None)
            agents.append((render(s, AGENT_FRAME, DEPTH_CELLS[0], order, profile.frames), n * len(depths)))
    return agents, list(sources.values())


def _grid_plan(chunk, spec, profile: GapProfile, seed: int, layers: int) -> list[tuple]:
    """The pairs readouts.gap.span_patch.grid_rows patches for one chunk, as (scenario, order, pair, the filler it
    swaps in or None, forwards per prompt): per scenario read in both cells, order (D's first `patch_orders`) and pair
    (the filler swap where the chunk has a partner), each prompt's stream and plain read, and each group at every grid
    depth patched into it from the other."""
    if profile.grid_stride < 1:
        return []
    per_prompt, out = 2 + len(PATCH_GROUPS) * len(patch_depths(layers, profile.grid_stride)), []
    for s in chunk:
        if not set(DEPTH_CELLS[:2]) <= {c for c in cells_read(s, profile) if spec.reads_cell(c)}:
            continue
        partner = filler_partner(chunk, s)
        for order in orders_for(s, spec, profile, seed)[: profile.patch_orders]:
            for pair in PATCH_PAIRS[: 1 if partner is None else 2]:
                out.append((s, order, pair, partner and partner.filler, per_prompt))
    return out


def depth_forwards(chunk, spec, profile: GapProfile, seed: int, layers: int) -> int:
    """How many forward passes a depth run's patching makes for one chunk beyond its reads (the progress bar's
    count; _depth gives their prompt lengths)."""
    agents, sources = _patch_plan(chunk, spec, profile, seed, layers)
    return sum(n for _, n in agents) + len(sources) + sum(2 * n for *_, n in _grid_plan(chunk, spec, profile, seed, layers))


def _depth(st: StageWork, tok, window, spec, profile: GapProfile, seed: int, layers: int) -> None:
    """A depth run's patching forwards of one window, chunk by chunk (a chunk's patch partners are its own
    scenarios): each a plain forward of a whole prompt, none sharing a prefix."""
    for i in range(0, len(window), profile.chunk_size):
        chunk = window[i: i + profile.chunk_size]
        agents, sources = _patch_plan(chunk, spec, profile, seed, layers)
        lengths = [len(ids) for ids in encode_prompts(tok, [prompt_of(r) for r, _ in agents] + [prompt_of(r) for r in sources])]
        lengths = [n for n, (_, k) in zip(lengths, agents) for _ in range(k)] + lengths[len(agents):]
        for s, order, pair, filler, n in _grid_plan(chunk, spec, profile, seed, layers):
            first, second, _, _ = pair_prompts(tok, s, order, profile.frames, pair, filler)
            lengths += [len(first), len(second)] * n
        st.prompts += len(lengths)
        st.reads += len(lengths)
        st.prompt_tokens += sum(lengths)
        st.computed_tokens += sum(lengths)


def gap_workload(tok, chunks, profile: GapProfile, groups, seed: int, bounds: BatchBounds,
                 depth_layers: int | None = None) -> list[StageWork]:
    """Per stage, the run's workload over all `chunks` (lists of scenarios: each the records of one window, which
    the run computes together); decoding batches as `generate` forms them under `bounds` (the run's device, or the
    GPU planned for). `depth_layers`: a depth run's model's decoder layers (its patching forwards, stage `depth`)."""
    out: dict[str, StageWork] = {}
    for chunk in chunks:
        for name, specs in stages(groups, profile):
            st = out.setdefault(name, StageWork(name))
            if specs[0].read == FIRST_TOKEN:
                _first_token(st, tok, chunk, specs[0], profile, seed)
                if depth_layers is not None and name == "D":
                    _depth(out.setdefault(DEPTH_STAGE, StageWork(DEPTH_STAGE)), tok, chunk, specs[0], profile, seed,
                           depth_layers)
            else:
                _generated(st, tok, chunk, specs, profile, seed, bounds)
    return list(out.values())
