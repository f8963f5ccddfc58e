"""What `readout panels ...` does: validate panel files, show a rendered frame, summarize a panel."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Sequence

from contract.names import FRAMINGS
from panels.frames import DEFAULT_VERSION, FRAMES, render, render_polarity
from panels.lint import ROLE_STRICT, report_lines, restated_roles, role_line_summary
from panels.records import PanelError
from panels.review import review_summary
from panels.schema import load_panel


def validate(paths) -> list[tuple[str, str | None, str | None, list[str]]]:
    """(path, None, summary, warnings) for each valid panel, (path, error line, None, []) for each invalid one.

    Gap panels also pass the role-line lint (panels/lint.py): a context restating the frame's role line is an
    error in a panel of record (ROLE_STRICT) and a warning elsewhere."""
    results = []
    for path in paths:
        try:
            panel = load_panel(path)
        except PanelError as exc:
            results.append((path, str(exc), None, []))
            continue
        reviewed = f", review {panel.review} holds" if panel.review else ""
        summary = f"{len(panel.records)} {panel.kind} records, sha256 {panel.sha256[:12]}{reviewed}"
        warnings = []
        if panel.kind == "gap":
            restated = restated_roles(panel.records)
            line = role_line_summary(panel.records)
            if restated and panel.name in ROLE_STRICT:
                first = ", ".join(f"{i} {f}" for i, _, f in restated[:3])
                results.append((path, f"{panel.path}: {line}, e.g. {first}; a panel of record must not", None, []))
                continue
            if restated:
                warnings.append(f"{path}: {line}")
            summary += f"; {line}"
        results.append((path, None, summary, warnings))
    return results


def show(panel_name: str, record_id: str, frame: str, cell: str = "primary", order_index: int | None = None,
         seed: int = 0, model: str | None = None, profile: str = "quick", frames: str = DEFAULT_VERSION,
         registry_files: Sequence[str] = ()) -> str:
    """The messages of one rendered frame, or with `model` the exact prompt text that model will read (resolved
    with the user registry `registry_files`).

    With `order_index`, the options stand in the order a `readout run` with this `seed` and `profile` read
    at that index (the same seeding as the run: probes.parquet's `order_index`); frames read after
    generated text (judge paraphrases, dose arms) have one order each, and the index must be 0. `frames` is the
    frames version the run read (its manifest's frames_version; `--set frames=v2`)."""
    panel = load_panel(panel_name)
    record = panel.get(record_id)
    if panel.kind == "nsi":
        if frame not in FRAMINGS:
            raise PanelError(f"{panel.path}: frame: '{frame}' is not a polarity framing ({', '.join(FRAMINGS)})")
        rendered = render_polarity(record, frame)
        messages, text, system, header = rendered.messages, None, None, f"{record.id} {frame} ({rendered.version}): {rendered.proposal}"
    else:
        if frame not in FRAMES:
            raise PanelError(f"{panel.path}: frame: '{frame}' is not one of {', '.join(FRAMES)}")
        order = None
        if order_index is not None:
            order = _run_order(record, frame, order_index, seed, profile, panel.path)
        rendered = render(record, frame, cell, order, frames)
        messages, text, system = rendered.messages, rendered.text, rendered.system
        mapping = ", ".join(f"{letter}={oid}" for letter, oid in zip(rendered.letters, rendered.option_ids))
        header = f"{record.id} {frame} {cell} ({rendered.version}); letters {mapping}; violating {rendered.violating_letter}"
    if model is None:
        parts = [header]
        if system:
            parts.append(f"--- system (replaces the template default)\n{system}")
        for m in messages or ():
            parts.append(f"--- {m['role']}\n{m['content']}")
        if text is not None:
            parts.append(f"--- raw text (no template; the letter is read next)\n{text}")
        return "\n".join(parts)
    from engine.loading import load_model
    from engine.render import Prompt, encode_prompt

    lm = load_model(model, registry_files=registry_files)
    prompt = Prompt(messages=messages, system=system) if messages else Prompt(text=text)
    ids = encode_prompt(lm.tokenizer, prompt)
    if panel.kind == "gap":
        lm.letters(rendered.letters)  # the letters must be single tokens for this model
    return f"{header}\n--- {len(ids)} tokens under {model}\n{lm.tokenizer.decode(ids)}"


def _run_order(record, frame: str, index: int, seed: int, profile_name: str, where: str) -> tuple[int, ...]:
    from contract.readouts import FIRST_TOKEN, READOUTS
    from readouts.gap.profile import PROFILES
    from readouts.gap.recipe import orders_for

    if profile_name not in PROFILES:
        raise PanelError(f"{where}: profile: '{profile_name}' is not one of {', '.join(PROFILES)}")
    spec = next(s for s in READOUTS if frame in s.frames and s.derived_from is None)
    orders = orders_for(record, spec, PROFILES[profile_name], seed)
    if spec.read == FIRST_TOKEN:
        if not 0 <= index < len(orders):
            raise PanelError(f"{where}: order: index {index} outside 0..{len(orders) - 1} ({spec.name}, {profile_name} profile)")
        return orders[index]
    if index != 0:
        raise PanelError(f"{where}: order: {frame} is read in one order per frame; its order index is 0")
    return orders[spec.frames.index(frame)]


def list_panels() -> list[tuple[str, str, int, str]]:
    """The shipped panels: (name, kind, records, file), in name order."""
    from panels.schema import shipped_panels

    out = []
    for name, path in shipped_panels().items():
        panel = load_panel(name)
        out.append((name, panel.kind, len(panel.records), path.name))
    return out


def quartile_line(values) -> str:
    """min, quartiles and max of `values`; quartiles interpolated inside the data's range (the inclusive
    method: on a small panel the exclusive one reports a q1 below the minimum or a q3 above the maximum)."""
    if len(values) < 2:
        return f"{values[0]:.3g} (one scenario)" if values else "no scenarios"
    q = statistics.quantiles(values, n=4, method="inclusive")
    return f"min {min(values):.3g}, q1 {q[0]:.3g}, median {q[1]:.3g}, q3 {q[2]:.3g}, max {max(values):.3g}"


def stats(panel_name: str) -> str:
    """Counts by family and domain and length distributions; for gap panels also writers and briefs per
    family, the cue-word lint and the review's state."""
    panel = load_panel(panel_name, review=False)  # stats serve the writing and review, so they come before it
    lines = [f"{panel.name}: {len(panel.records)} {panel.kind} records ({panel.path}, sha256 {panel.sha256[:12]})"]
    if panel.kind == "nsi":
        by_domain = Counter(r.domain for r in panel.records)
        lines.append("domains: " + ", ".join(f"{d} {n}" for d, n in sorted(by_domain.items())))
        words = [len(r.scenario.split()) for r in panel.records]
        lines.append(f"scenario words: min {min(words)}, median {statistics.median(words):g}, max {max(words)}")
        return "\n".join(lines)
    by_family = Counter(r.family for r in panel.records)
    domains = defaultdict(Counter)
    for r in panel.records:
        domains[r.family][r.domain] += 1
    lines.append("family  n   domains")
    for fam in sorted(by_family):
        lines.append(f"{fam}      {by_family[fam]:<3} {len(domains[fam])}: " + ", ".join(f"{d} {n}" for d, n in sorted(domains[fam].items())))
    lines.append("generators: " + ", ".join(f"{g} {n}" for g, n in sorted(Counter(r.generator for r in panel.records).items())))
    lines.append("options per scenario: " + ", ".join(f"{k}: {n}" for k, n in sorted(Counter(len(r.options) for r in panel.records).items())))
    lines.append(f"harm twins: {sum(1 for r in panel.records if r.harm_twin_filler)}")
    lines.append(f"paraphrases: {sum(1 for r in panel.records if r.paraphrase)}")
    for label, values in [
        ("context words (primary)", [len(r.situation("primary").split()) for r in panel.records]),
        ("pressure words", [len(r.pressure.split()) for r in panel.records]),
        ("filler / pressure words", [len(r.filler.split()) / len(r.pressure.split()) for r in panel.records]),
    ]:
        lines.append(f"{label}: " + quartile_line(values))
    lines += [*report_lines(panel.records), review_summary(panel)]
    return "\n".join(lines)
