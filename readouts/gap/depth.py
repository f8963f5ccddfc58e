"""The depth readout of the judgment-action study: each first-token read's letters at every depth through the
logit lens, and through a tuned lens when the run has one (depth.parquet); and the agent read with its
read-position residual replaced by another prompt's at one depth (patching.parquet). The engine supplies the
residuals, the patched forward and the lens (engine/residuals.py, engine/tuned_lens.py); this module decides which
prompts are read, patched and paired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from contract.names import DEPTH_CELLS, LENSES, PATCH_SOURCES
from contract.readouts import readout
from engine.render import encode_prompt
from engine.residuals import Patch, lens_logits, n_depths
from engine.scoring import letter_masses, score_ids
from panels.frames import render
from readouts.gap.prompts import prompt_of

LENS_READS = 8
"""Reads whose depths go through the head at once (bounds the [reads x depths, vocab] fp32 logits held)."""
(JUDGE_FRAME,) = readout("J0").frames
"""The frame of the patch's source: the agent prompt is patched with the letter-only judge prompt's residual."""


def p_violating(mass, letters: str, violating_letter: str) -> float:
    total = sum(mass)
    return mass[letters.index(violating_letter)] / total if total > 0 else math.nan


def _key_row(model_name: str, rd) -> dict:
    r = rd.rendered
    return dict(model=model_name, scenario_id=rd.scenario.id, family=rd.scenario.family, cell=rd.cell,
                order_index=rd.order_index, order=",".join(r.option_ids), letters="".join(r.letters),
                violating_letter=r.violating_letter)


def lens_reads(model, residuals: list[torch.Tensor], letter_tokens: list, lens=None) -> list[dict]:
    """Per read, per lens (contract.names.LENSES: the logit lens, and the tuned lens when `lens` is given): the
    LetterMass at every depth and the KL in nats of that depth's full-vocabulary distribution from the last depth's."""
    out = []
    for start in range(0, len(residuals), LENS_READS):
        part = torch.stack(residuals[start : start + LENS_READS])  # [reads, depths, hidden]
        reads, depths = part.shape[:2]
        letters = [lt for lt in letter_tokens[start : start + LENS_READS] for _ in range(depths)]
        per = [{} for _ in range(reads)]
        for name, streams in ((LENSES[0], part), (LENSES[1], None if lens is None else lens.translate(part))):
            if streams is None:
                continue
            logits = lens_logits(model, streams).reshape(reads * depths, -1)
            masses = letter_masses(logits, letters, [0] * len(letters), 1.0, 1.0)
            logp = logits.log_softmax(-1).reshape(reads, depths, -1)
            final = logp[:, -1:, :]
            kl = (final.exp() * (final - logp)).sum(-1).cpu().tolist()
            for i in range(reads):
                per[i][name] = (masses[i * depths : (i + 1) * depths], kl[i])
        out += per
    return out


def depth_rows(lm, model_name: str, reads, results, lens=None) -> list[dict]:
    """depth.parquet rows of the reads whose results carry residuals (rollout 0 of first-token reads), through
    the logit lens and, given a tuned lens (engine.tuned_lens.TunedLens), through it too."""
    picked = [(rd, res) for rd, res in zip(reads, results) if res.residuals is not None and rd.cell in DEPTH_CELLS]
    if not picked:
        return []
    per_read = lens_reads(lm.model, [res.residuals for _, res in picked],
                          [lm.letters(rd.rendered.letters) for rd, _ in picked], lens)
    rows = []
    for (rd, _), by_lens in zip(picked, per_read):
        key = _key_row(model_name, rd)
        for name, (masses, kl) in by_lens.items():
            for layer, (m, k) in enumerate(zip(masses, kl)):
                rows.append(dict(**key, readout=rd.spec.name, frame=rd.frame, layer=layer, n_layers=len(masses) - 1,
                                 lens=name, mass=list(m.mass), letter_mass=m.letter_mass,
                                 p_violating=p_violating(m.mass, key["letters"], key["violating_letter"]), kl_final=k))
    return rows


def patch_depths(n: int, stride: int) -> list[int]:
    """Depths patched: every `stride`-th of 0..n (n: the number of layers), and n itself."""
    return sorted(set(range(0, n + 1, stride)) | {n})


@dataclass
class _Source:
    scenario_id: str
    residuals: torch.Tensor
    p: float


def foreign_partner(scenarios, s):
    """The next scenario after `s` in the chunk (cyclically) with as many options, or None."""
    i = next(k for k, x in enumerate(scenarios) if x.id == s.id)
    for x in scenarios[i + 1 :] + scenarios[:i]:
        if len(x.options) == len(s.options):
            return x
    return None


def patch_rows(runner, scenarios, agent_reads, agent_results) -> list[dict]:
    """patching.parquet rows: each primary agent read of the first `patch_orders` orders, patched at every
    patched depth from each source (contract.names.PATCH_SOURCES) in the same option order."""
    lm, profile = runner.lm, runner.profile
    if profile.patch_stride < 1:
        return []
    agent = {(rd.scenario.id, rd.cell, rd.order_index): (rd, res) for rd, res in zip(agent_reads, agent_results)
             if rd.rollout == 0 and res.residuals is not None and rd.order_index < profile.patch_orders}
    targets = [key for key in agent if key[1] == DEPTH_CELLS[0]]
    if not targets:
        return []
    by_id = {s.id: s for s in scenarios}
    # The letter-only judge prompt in each patched agent read's option order (the judge readout's own orders differ
    # from D's), of the same scenario and of its foreign partner (the same order applied to its options).
    # The foreign partner's agent prompt too (its read in this cell and order: the same frame, another scenario).
    wanted = {}
    for sid, cell, k in targets:
        rd = agent[(sid, cell, k)][0]
        order = _order_of(by_id[sid], rd)
        partner = foreign_partner(scenarios, by_id[sid])
        for source in (by_id[sid], partner):
            if source is not None:
                wanted[(source.id, JUDGE_FRAME, order)] = render(source, JUDGE_FRAME, DEPTH_CELLS[0], order, profile.frames)
        if partner is not None:
            wanted[(partner.id, rd.frame, order)] = render(partner, rd.frame, DEPTH_CELLS[0], order, profile.frames)
    keys = list(wanted)
    scored = score_ids(lm.model, [tuple(encode_prompt(lm.tokenizer, prompt_of(wanted[key]))) for key in keys],
                       [lm.letters(wanted[key].letters) for key in keys], residuals=True, pad_id=lm.pad_id,
                       token_budget=runner.token_budget)
    runner.tick(len(keys))
    source_reads = dict(zip(keys, scored))
    depths = patch_depths(n_depths(lm.model) - 1, profile.patch_stride)
    jobs = []
    for sid, cell, k in targets:
        rd, res = agent[(sid, cell, k)]
        order, letters, v = _order_of(by_id[sid], rd), "".join(rd.rendered.letters), rd.rendered.violating_letter
        twin = agent.get((sid, DEPTH_CELLS[1], k))
        partner = foreign_partner(scenarios, by_id[sid])
        found = {PATCH_SOURCES[0]: (sid, source_reads[(sid, JUDGE_FRAME, order)]),
                 PATCH_SOURCES[1]: None if twin is None else (sid, twin[1]),
                 PATCH_SOURCES[2]: None if partner is None else (partner.id, source_reads[(partner.id, JUDGE_FRAME, order)]),
                 PATCH_SOURCES[3]: None if partner is None else (partner.id, source_reads[(partner.id, rd.frame, order)])}
        for name in PATCH_SOURCES:
            if found[name] is not None:
                source_id, out = found[name]
                # p_source: the source prompt's own read, on the letter this agent read's violating option has.
                src = _Source(source_id, out.residuals, p_violating(out.mass, letters, v))
                jobs += [(rd, res, name, src, d) for d in depths]
    patched = score_ids(lm.model, [rd.ids for rd, *_ in jobs], [lm.letters(rd.rendered.letters) for rd, *_ in jobs],
                        patches=[Patch(d, src.residuals[d]) for _, _, _, src, d in jobs], pad_id=lm.pad_id,
                        token_budget=runner.token_budget)
    runner.tick(len(jobs))
    rows = []
    for (rd, res, name, src, d), out in zip(jobs, patched):
        key = _key_row(runner.model_name, rd)
        rows.append(dict(**key, layer=d, n_layers=depths[-1], source=name, source_scenario_id=src.scenario_id,
                         mass=list(out.mass), letter_mass=out.letter_mass,
                         p_violating=p_violating(out.mass, key["letters"], key["violating_letter"]),
                         p_agent=p_violating(res.mass, key["letters"], key["violating_letter"]), p_source=src.p))
    return rows


def _order_of(scenario, rd) -> tuple[int, ...]:
    """The option order (indices into the scenario's options) a read was rendered in."""
    index = {o.id: i for i, o in enumerate(scenario.options)}
    return tuple(index[o] for o in rd.rendered.option_ids)
