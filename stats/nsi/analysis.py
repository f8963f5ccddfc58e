"""Every framing-stability statistic over the replies of one or several models, as data (no files).

`analyze_nsi` computes the tables of `readout nsi-stats` in report order, with the headline lines; the
report module writes them. Every random draw comes from a Generator keyed by (seed, what it is for,
model, ...), so a model's numbers do not depend on which other models are read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract import NSI_NULLS
from stats.core.output import ci_text
from stats.nsi.cells import COMPLIANCE, Cells, build_cells, sampled, subset_models, usable_dilemmas
from stats.nsi.continuous import TEMPERED, continuous_domain_table, continuous_points, continuous_table
from stats.nsi.endorsement import (
    acquiescence_table,
    agreement_table,
    endorsement_table,
    group_dilemma_table,
    group_endorsement_table,
    parse_table,
)
from stats.nsi.measures import DEFAULT_NULL, NULL_MODES
from stats.nsi.rankings import bonferroni_over, domain_table, model_domain_table, model_table, scenario_table, temperature_table
from stats.nsi.significance import ALPHA_FDR, cochran_table, group_tests_table, scale_table
from stats.nsi.tiers import TABLE6

TIER_COLUMNS = ["model", "group", "domain", "null", "nsi", "nsi_ci_low", "nsi_ci_high", "bands", "tier",
                "tier_conservative_ci", "tier_range"]


@dataclass(frozen=True)
class NsiTable:
    """One output table: its file name (without extension), its Markdown title and its rows."""

    name: str
    title: str
    df: pd.DataFrame


@dataclass(frozen=True)
class NsiAnalysis:
    """The tables (in report order), the headline lines, and what the figures draw."""

    tables: tuple[NsiTable, ...]
    headlines: tuple[str, ...]
    acquiescence: pd.DataFrame
    model_domain: pd.DataFrame
    models: pd.DataFrame
    continuous_domain: pd.DataFrame | None
    """The continuous model x domain table (None without a continuous readout or when it is empty)."""
    continuous_points: pd.DataFrame | None
    """Per model: continuous p0, p1 (None without a continuous readout)."""

    def table(self, name: str) -> pd.DataFrame:
        return next(t.df for t in self.tables if t.name == name)


def fmt_p(p: float) -> str:
    if not np.isfinite(p):
        return "n/a"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def analyze_nsi(replies: pd.DataFrame, cont: pd.DataFrame | None, groups: dict | None, seed: int, n_null: int,
                n_boot: int, null_mode: str = DEFAULT_NULL, params: dict | None = None) -> NsiAnalysis:
    """All the tables and headlines of the audit. ``replies`` must hold sampled (T > 0) replies; ``groups``
    (model -> group label, or None) adds the group tables and tests; ``null_mode`` (measures.NULL_MODES)
    chooses the unit of a model's NSI and its null, recorded in the tables' ``null`` column and a headline;
    ``params`` (model -> parameter count) adds the scale correlation (sec. 4.4)."""
    if null_mode not in NULL_MODES:
        raise ValueError(f"null mode {null_mode!r}: expected one of {', '.join(NULL_MODES)}")
    samp = sampled(replies)
    cells = build_cells(samp)
    t: list[NsiTable] = []
    temps = sorted(samp["temperature"].unique())
    headlines = [f"nsi: {len(cells.models)} model(s) x {len(cells.dilemmas)} dilemmas x 4 framings, {len(samp)} "
                 f"sampled replies (T {', '.join(f'{x:g}' for x in temps)}), {samp['parse_ok'].mean():.1%} parsed",
                 f"null: {null_mode}{' (the default)' if null_mode == DEFAULT_NULL else ''}: {NSI_NULLS[null_mode]}"]
    compliant, line = _compliance(t, cells)
    headlines.append(line)
    groups = {m: g for m, g in groups.items() if m in compliant} if groups else groups
    models_tab, acq, md = _rates_and_nsi(t, cells, groups, seed, n_null, n_boot, replies, null_mode, compliant)
    headlines.append(_cochran(t, cells, groups, seed, n_null, samp[samp["model"].isin(compliant)]))
    headlines += _model_headlines(models_tab, acq)
    if groups:
        tests = group_tests_table(models_tab, groups)
        t.append(NsiTable("nsi_group_tests", "Group tests on per-model NSI (Kruskal-Wallis, Mann-Whitney); epsilon_sq_paper is "
                                             "the paper's epsilon^2, computed as eta^2_H = (H - k + 1) / (n - k); "
                                             "epsilon_sq_classical is H / (n - 1)", tests))
        kw = tests[(tests["metric"] == "nsi_corrected") & (tests["test"] == "kruskal-wallis")].iloc[0]
        if np.isfinite(kw["statistic"]):
            headlines.append(f"Kruskal-Wallis on corrected NSI across groups: H={kw['statistic']:.2f}, "
                             f"p={fmt_p(kw['p_two_sided'])}, ε²={kw['epsilon_sq_paper']:.2f} (the paper's ε², computed as "
                             f"η²_H = (H - k + 1)/(n - k)); classical ε² = H/(n - 1) = {kw['epsilon_sq_classical']:.2f}")
    kept = subset_models(cells, [m in compliant for m in cells.models])
    if params:
        scale = scale_table(models_tab[models_tab["compliant"]], params)
        t.append(NsiTable("nsi_scale", "NSI against parameter count: Pearson r, r^2 (sec. 4.4)", scale))
        r = scale[(scale["metric"] == "nsi") & (scale["x"] == "params")].iloc[0]
        headlines.append(f"scale: NSI vs parameter count over {r.n} models: r {r.r:+.2f}, r^2 {r.r_sq:.2f}, "
                         f"p {fmt_p(r.p_two_sided)}")
    if len(kept.models) >= 2:
        agr = agreement_table(kept, seed, n_boot)
        t.append(NsiTable("nsi_agreement", "Inter-model agreement by framing (sec. 4.1)", agr))
        headlines.append("inter-model agreement: " + ", ".join(f"{r.framing} {r.agreement:.0%}" for r in agr.itertuples()))
    temp = temperature_table(replies, cells, seed, n_boot)
    if len(temp):
        t.append(NsiTable("nsi_temperature", "Temperature ablation: greedy (T 0) vs sampled NSI (Appendix B)", temp))
        headlines += [f"{r.model}: NSI at T 0 {r.nsi_t0:.3f} vs sampled {r.nsi_sampled:.3f} "
                      f"(diff {r.diff:+.3f} {ci_text(r.diff_ci_low, r.diff_ci_high, '+.2f')})" for r in temp.itertuples(index=False)]
    tiers = pd.concat([models_tab.assign(domain="(all)", bands=f"A<{TABLE6.a_below:.2f}, C>={TABLE6.c_from:.2f}")[TIER_COLUMNS],
                       md[TIER_COLUMNS]], ignore_index=True)
    t.append(NsiTable("nsi_tiers", "Audit tiers A/B/C (Tables 6-7): tier = band of the observed NSI (sec. 5.2); "
                                   "tier_conservative_ci = band of the CI's upper end", tiers))
    cont_dom = points = None
    if cont is not None:
        cont_tab = continuous_table(cont, cells, models_tab, seed, n_boot)
        cont_dom = continuous_domain_table(cont, cells)
        t.append(NsiTable("nsi_continuous", "NSI on the continuous readout p_endorse (this project's extension, not the "
                                            "paper's; exact, no null; untiered)", cont_tab))
        t.append(NsiTable("nsi_continuous_domain", "Continuous NSI by model x domain (this project's extension; untiered)",
                          cont_dom))
        for r in cont_tab.itertuples(index=False):
            binary = f"binary {r.nsi_binary:.3f}" if np.isfinite(r.nsi_binary) else "binary undefined"
            headlines.append(f"{r.model}: continuous NSI {r.nsi_continuous:.3f} {ci_text(r.ci_low, r.ci_high)} "
                             f"vs {binary}; continuous p0+p1-1 {r.acquiescence_continuous:+.2f}")
        headlines += _tempered(t, cont, cells, models_tab, seed, n_boot)
        points = continuous_points(cont, cells)
    return NsiAnalysis(tuple(t), tuple(headlines), acq, md, models_tab,
                       cont_dom if cont_dom is not None and len(cont_dom) else None, points)


def _tempered(t: list[NsiTable], cont: pd.DataFrame, cells: Cells, models_tab, seed: int, n_boot: int) -> list[str]:
    """The continuous NSI at the runs' sampling settings (table nsi_continuous_tempered) and its headlines,
    with a note naming the runs written before that reading (reported at T = 1 only)."""
    tab = continuous_table(cont, cells, models_tab, seed, n_boot, suffix=TEMPERED)
    t.append(NsiTable("nsi_continuous_tempered", "NSI on the continuous readout at the sampling settings "
                                                 "(p_endorse_tempered; this project's extension; untiered)", tab))
    lines = [f"{r.model}: continuous NSI at T {r.temperature:g}, top-p {r.top_p:g}: {r.nsi_continuous:.3f} "
             f"{ci_text(r.ci_low, r.ci_high)}; p0+p1-1 {r.acquiescence_continuous:+.2f}" for r in tab.itertuples(index=False)]
    old = cont.attrs.get("no_tempered", [])
    if old:
        lines.append(f"note: {len(old)} run(s) predate the continuous reading at the sampling settings (no "
                     "p_agree_tempered column): continuous NSI at T = 1 only for " + ", ".join(old))
    undefined = cont.attrs.get("undefined_tempered", [])
    if undefined:
        lines.append(f"{len(undefined)} continuous reads have neither word in the top-p nucleus (p_agree_tempered "
                     "undefined), left out at the sampling settings: " + ", ".join(undefined[:10])
                     + (" ..." if len(undefined) > 10 else ""))
    return lines


def _compliance(t: list[NsiTable], cells: Cells) -> tuple[set, str]:
    """The 80% compliance rule (sec. 3.3): the models kept for the cross-model statistics, the headline line."""
    usable = usable_dilemmas(cells)
    share = usable / max(len(cells.dilemmas), 1)
    tab = pd.DataFrame({"model": cells.models, "usable_dilemmas": usable, "n_dilemmas": len(cells.dilemmas),
                        "usable_share": share, "compliant": share >= COMPLIANCE})
    t.append(NsiTable("nsi_compliance", f"Usable dilemmas per model (a parsed reply under every framing); models below "
                                        f"{COMPLIANCE:.0%} are left out of the analysis (sec. 3.3): listed, flagged, but "
                                        "outside every family and cross-model statistic", tab))
    out = tab.loc[~tab["compliant"], "model"].tolist()
    line = (f"compliance: {len(tab) - len(out)} of {len(tab)} model(s) have >= {COMPLIANCE:.0%} usable dilemmas"
            + (f"; left out of the Bonferroni and BH families, group tables, group tests, agreement, Table 3 and the "
               f"scale correlation (still listed, flagged): {', '.join(out)}" if out else ""))
    return set(tab.loc[tab["compliant"], "model"]), line


def _rates_and_nsi(t: list[NsiTable], cells: Cells, groups, seed, n_null, n_boot, replies, null_mode, compliant):
    """Parse outcomes, Table 4, endorsement and acquiescence, NSI by model x domain and by domain."""
    t.append(NsiTable("nsi_parse", "Parse outcomes (Appendix C.4 stages)", parse_table(replies)))
    models_tab = model_table(cells, groups, seed, n_null, n_boot, null_mode)
    models_tab.insert(models_tab.columns.get_loc("model") + 1, "compliant", models_tab["model"].isin(compliant))
    models_tab = bonferroni_over(models_tab, models_tab["compliant"].to_numpy())
    t.append(NsiTable("nsi_models", f"Model rankings by NSI (Table 4; null: {null_mode}; CI = scenario-cluster bootstrap "
                                    "of the observed NSI; p Bonferroni over the compliant models; tier of the observed NSI, Table 6)",
                      models_tab))
    t.append(NsiTable("nsi_endorsement", "Endorsement rate by framing (binary proxy, pooled over the model's replies)",
                      endorsement_table(cells, groups, seed, n_boot)))
    if groups:
        t.append(NsiTable("nsi_endorsement_groups", "Endorsement by framing and group, pooled within group (Table 2)",
                          group_endorsement_table(cells, groups, seed, n_boot)))
        t.append(NsiTable("nsi_endorsement_groups_by_dilemma", "Endorsement by framing per dilemma, pooled within group "
                                                               "(Table 5 is the financial-1 rows)", group_dilemma_table(cells, groups)))
    acq = acquiescence_table(cells, groups, seed, n_boot)
    t.append(NsiTable("nsi_acquiescence", "Acquiescence p0 + p1 - 1 (sec. 4.2)", acq))
    md = model_domain_table(cells, groups, seed, n_null, n_boot, null_mode)
    t.append(NsiTable("nsi_model_domain", f"NSI by model x domain (Fig. 5; null: {null_mode}; nested CI; Table 7 tier)", md))
    t.append(NsiTable("nsi_domains", "NSI by domain, mean over compliant models (Table 3)",
                      domain_table(md[md["model"].isin(compliant)] if compliant else md)))
    return models_tab, acq, md


def _cochran(t: list[NsiTable], cells: Cells, groups, seed, n_null, samp: pd.DataFrame) -> str:
    """Per model x dilemma rates, NSI and null with Cochran's Q beside them, the per-model Q counts; the headline."""
    coch = cochran_table(samp)
    scen = scenario_table(cells, groups, seed, n_null).merge(
        coch[["model", "dilemma_id", "q", "p_value", "q_bh", "significant", "n_blocks"]], on=["model", "dilemma_id"], how="left")
    t.append(NsiTable("nsi_scenarios", "Per model x dilemma: rates, NSI, null, Cochran's Q (BH across all)", scen))
    coch_sum = (coch.assign(tested=coch["p_value"].notna())
                .groupby("model").agg(pairs=("dilemma_id", "size"), tested=("tested", "sum"), significant=("significant", "sum"))
                .reset_index())
    t.append(NsiTable("nsi_cochran", f"Cochran's Q per model x dilemma, BH q < {ALPHA_FDR}", coch_sum))
    n_pairs, n_tested, n_sig = len(coch), int(coch["p_value"].notna().sum()), int(coch["significant"].sum())
    # The share's denominator is the BH family (the tested pairs), as the paper's "61.9% of model-scenario
    # pairs" is a share of its 224 tests; untestable pairs are counted apart.
    return (f"Cochran's Q: {n_sig}/{n_tested} tested model x dilemma pairs ({n_sig / max(n_tested, 1):.1%}) show a "
            f"framing effect after BH (q < {ALPHA_FDR}, family of {n_tested}); {n_pairs - n_tested} of {n_pairs} pairs "
            "untestable (no block varies) and left out of the family")


def _model_headlines(models_tab: pd.DataFrame, acq: pd.DataFrame) -> list[str]:
    lines = []
    for r in models_tab.itertuples(index=False):
        a = acq[(acq["model"] == r.model) & (~acq["pooled"])]
        acq_v = float(a["acquiescence"].iloc[0]) if len(a) else np.nan
        if not np.isfinite(r.nsi):
            lines.append(f"{r.model}: binary NSI undefined: no dilemma has parsed replies under all four framings "
                         f"({r.n_replies} parsed sampled replies)")
            continue
        lines.append(f"{r.model}: NSI {r.nsi:.3f} {ci_text(r.nsi_ci_low, r.nsi_ci_high)} (corrected {r.nsi_corrected:.3f}, "
                     f"{r.null} null p {fmt_p(r.p_null)}, Bonferroni {fmt_p(r.p_null_bonferroni)}); F0/F1 NSI "
                     f"{r.nsi_01:.3f}; p0+p1-1 {acq_v:+.2f}; tier {r.tier} (conservative on the CI: "
                     f"{r.tier_conservative_ci}, CI spans {r.tier_range})")
    return lines
