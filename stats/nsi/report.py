"""`readout nsi-stats RUN_DIR...`: the framing-stability statistics written as tables, figures and a report.

Owns: `run_nsi_stats` (the CLI's entry point) and the output folder's files: one CSV (full precision) and one
Markdown file per table, fig_acquiescence.png (Fig. 4), fig_nsi_heatmap.png (Fig. 5), fig_agreement.png
(Fig. 3, with two or more models), nsi_report.md and headlines.txt.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

from contract.tables import NSI_REPLIES
from stats.core.errors import NSITableError
from stats.core.manifest import read_run_manifest, settings_note
from stats.core.output import md_section, write_table
from stats.nsi.analysis import NsiAnalysis, analyze_nsi
from stats.nsi.measures import DEFAULT_NULL, N_NULL
from stats.nsi.rankings import N_BOOT
from stats.nsi.tables import load_runs


def run_nsi_stats(run_dirs, out_dir=None, groups: dict | None = None, seed: int = 0, *,
                  n_null: int = N_NULL, n_boot: int = N_BOOT, null_mode: str = DEFAULT_NULL,
                  params: dict | None = None) -> list[str]:
    """Compute every framing-stability statistic over ``run_dirs`` and write tables + figures to ``out_dir``.

    ``groups`` maps model name -> group label (for group tables, Kruskal-Wallis and Mann-Whitney).
    ``null_mode``: one of measures.NULL_MODES (``dilemma-rates``, the default), recorded in the
    tables' ``null`` column and in the headlines. ``params`` (model -> parameter count) adds the scale
    correlation of sec. 4.4. With one
    run directory and no ``out_dir`` the output goes to ``RUN_DIR/stats``. Returns headline lines.
    Quantities that a run cannot define (e.g. NSI of a dilemma with a framing whose replies all failed to
    parse) are NaN in the tables, blank in the Markdown, and said so in the headlines.
    """
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    run_dirs = [Path(r) for r in run_dirs]
    if out_dir is None:
        if len(run_dirs) != 1:
            raise NSITableError("several run directories need an explicit output directory")
        out_dir = run_dirs[0] / "stats"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    replies, cont = load_runs(run_dirs)
    groups = {str(k): str(v) for k, v in groups.items()} if groups else None
    if groups:
        unknown = sorted(set(groups) - set(replies["model"]))
        if unknown:
            raise NSITableError(f"groups name models not in the runs: {unknown}")
    if not (replies["temperature"] > 0).any():
        raise NSITableError(f"{run_dirs[0] / NSI_REPLIES.file}: column temperature: no sampled (T > 0) replies")
    with warnings.catch_warnings():
        # Empty cells make NaN means by design; numpy's warnings about them are noise here.
        warnings.filterwarnings("ignore", message="Mean of empty slice", category=RuntimeWarning)
        warnings.filterwarnings("ignore", message="All-NaN slice encountered", category=RuntimeWarning)
        warnings.filterwarnings("ignore", message="invalid value encountered", category=RuntimeWarning)
        a = analyze_nsi(replies, cont, groups, seed, n_null, n_boot, null_mode, params)
        undefined = cont.attrs.get("undefined", []) if cont is not None else []
        if undefined:  # counted and named, never dropped silently
            note = (f"{len(undefined)} continuous reads put no mass on either word (p_agree undefined) and are left "
                    "out: " + ", ".join(undefined[:10]) + (" ..." if len(undefined) > 10 else ""))
            a = replace(a, headlines=(*a.headlines, note))
        notes = [(rd, settings_note(read_run_manifest(rd, "nsi")[0])) for rd in run_dirs]
        named = [n if len(run_dirs) == 1 else f"{rd}: {n}" for rd, n in notes if n]
        if named:  # first: a quick run's numbers are not the paper's
            a = replace(a, headlines=(*named, *a.headlines))
        write_nsi_report(a, out)
    return list(a.headlines)


def write_nsi_report(a: NsiAnalysis, out: Path) -> None:
    """Every table (CSV + Markdown), both figures, nsi_report.md and headlines.txt into `out`."""
    from stats.nsi.figures import acquiescence_figure, agreement_figure, heatmap_figure  # matplotlib only when writing

    report = ["# Framing-stability audit (NSI)\n", md_section("Headlines", "\n".join(f"- {h}" for h in a.headlines))]
    report += [write_table(t.df, out, t.name, t.title) for t in a.tables]
    acquiescence_figure(a.acquiescence, out / "fig_acquiescence.png", cont_points=a.continuous_points)
    heatmap_figure(a.model_domain, a.models, out / "fig_nsi_heatmap.png", continuous=a.continuous_domain)
    figs = "## Figures\n\n![acquiescence](fig_acquiescence.png)\n\n![NSI heatmap](fig_nsi_heatmap.png)\n"
    names = [t.name for t in a.tables]
    if "nsi_agreement" in names:
        agreement_figure(a.table("nsi_agreement"), out / "fig_agreement.png")
        figs += "\n![inter-model agreement](fig_agreement.png)\n"
    report.append(figs)
    (out / "nsi_report.md").write_text("\n".join(report), encoding="utf-8")
    (out / "headlines.txt").write_text("\n".join(a.headlines) + "\n", encoding="utf-8")
