"""Human coding of the framing-stability audit (negation paper sec. 3.6, 4.2), second half: gold labels
(codebook in `stats.nsi.coding`) scored against the run's binary proxy.

Gold labels: a CSV with one row per coded item (a Label Studio CSV export has this shape), or a Label
Studio JSON export (``.json``; the first non-cancelled annotation of each task), with ``item_id``
(required), ``action_stance`` (required), ``integrity`` (optional, needed for conflict rates) and
``judge_action_stance`` / ``judge_integrity`` (optional: an automated judge's labels, scored by macro-F1).
`gold_tables` computes every table (pure); `gold_report` reads the files and writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from contract import FRAMINGS, NEGATED
from contract.tables import NSI_REPLIES
from stats.core.errors import NSITableError
from stats.core.output import md_section, write_table
from stats.core.seeding import ENTROPY, rng_for
from stats.nsi.agreement import agreement, cohen_kappa, macro_f1, wilson
from stats.nsi.coding import ACTION_STANCE, AXES, JUDGE_GATE, with_ids
from stats.nsi.tables import read_replies_many

SUPPORTS = "SUPPORTS_X"
"""The stance the binary proxy's 'endorse' claims: SUPPORTS_X."""
CONFLICT = "DECISION_REASONING_CONFLICT"


def _norm_label(v):
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    s = str(v).strip().upper().replace("-", "_").replace(" ", "_")
    return s or None


def _label_studio_json(path: Path) -> pd.DataFrame:
    """Rows of a Label Studio JSON export: item_id and the choices of each task's first kept annotation."""
    try:
        tasks = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise NSITableError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(tasks, list):
        raise NSITableError(f"{path}: expected a Label Studio JSON export (a list of tasks)")
    rows = []
    for task in tasks:
        data = task.get("data", {}) if isinstance(task, dict) else {}
        kept = [a for a in task.get("annotations", []) if not a.get("was_cancelled")] if isinstance(task, dict) else []
        if "item_id" not in data or not kept:
            continue
        row = {"item_id": data["item_id"]}
        for res in kept[0].get("result", []):
            choices = (res.get("value") or {}).get("choices")
            if res.get("from_name") and choices:
                row[res["from_name"]] = choices[0]
        rows.append(row)
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=["item_id"])


def read_labels(path, required=("item_id", "action_stance")) -> pd.DataFrame:
    """Read a coder's labels, normalize them and check them against the codebook (one-line errors).

    ``path`` is a CSV (columns in the module docstring; a Label Studio CSV export has them) or a Label
    Studio JSON export (``.json``: the first non-cancelled annotation of each task is read).
    """
    path = Path(path)
    if not path.is_file():
        raise NSITableError(f"{path}: file not found")
    if path.suffix.lower() == ".json":
        df = _label_studio_json(path)
    else:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    for col in required:
        if col not in df.columns:
            raise NSITableError(f"{path}: column {col}: missing")
    if df["item_id"].isna().any():
        raise NSITableError(f"{path}: column item_id: {int(df['item_id'].isna().sum())} empty values")
    dup = df["item_id"].duplicated()
    if dup.any():
        raise NSITableError(f"{path}: column item_id: duplicate id {df.loc[dup, 'item_id'].iloc[0]!r}")
    for axis, labels in AXES.items():
        for col in (axis, f"judge_{axis}"):
            if col not in df.columns:
                continue
            df[col] = df[col].map(_norm_label)
            bad = df[col].notna() & ~df[col].isin(labels)
            if bad.any():
                raise NSITableError(f"{path}: column {col}: {df.loc[bad, col].iloc[0]!r} is not one of {', '.join(labels)}")
    if df["action_stance"].isna().any():
        raise NSITableError(f"{path}: column action_stance: {int(df['action_stance'].isna().sum())} items without a label")
    return df


def _prop_row(label: str, k: int, n: int, **extra) -> dict:
    p = wilson(k, n)
    return {"stratum": label, **extra, "k": p.k, "n": p.n, "rate": p.p, "ci_low": p.ci_low, "ci_high": p.ci_high}


def gold_report(run_dirs, gold_csv, second_csv=None, out_dir=None, *, groups: dict | None = None, seed: int = 0,
                n_boot: int = 2000, rater_a=None, rater_b=None) -> list[str]:
    """Score gold labels against the binary proxy of one or several runs; returns headline lines, writes tables
    when ``out_dir``.

    Computes (sec. 3.6, 4.2): the proxy over-count P(gold != SUPPORTS_X | proxy endorse) with Wilson CIs per
    framing and pooled (and the under-count P(gold = SUPPORTS_X | proxy not endorse)); the gold class
    composition of proxy-endorse rows; proxy-vs-gold Cohen's kappa and accuracy (pooled, per model, per group);
    post-stratified gold SUPPORTS_X rates per framing (the sample's rates within proxy strata, weighted by the
    runs' proxy shares); decision-reasoning conflict rates with Wilson CIs per framing and model, with Fisher's
    exact test negated vs affirmative and, with ``groups``, the exact one-sided permutation test of each group's
    per-model rates against the rest; two-rater reliability per axis (raw agreement, Cohen's kappa,
    Krippendorff's alpha with an item-bootstrap CI, Gwet's AC1) between ``rater_a`` and ``rater_b`` (the
    paper's protocol: the two raters' independent labels; the gold file is their adjudication), or, without
    them, between the gold file and ``second_csv``; with judge columns, the judge's macro-F1 against gold.
    """
    replies = with_ids(read_replies_many(run_dirs))
    gold = read_labels(gold_csv)
    unknown = sorted(set(gold["item_id"]) - set(replies["item_id"]))
    if unknown:
        raise NSITableError(f"{gold_csv}: column item_id: {len(unknown)} ids not in the runs' {NSI_REPLIES.file} "
                            f"(e.g. {unknown[0]!r})")
    if (rater_a is None) != (rater_b is None):
        raise NSITableError(f"{rater_a or rater_b}: rater files come in pairs (rater A and rater B)")
    raters = (read_labels(rater_a), read_labels(rater_b)) if rater_a is not None else None
    second = read_labels(second_csv) if second_csv is not None else None
    tables, lines = gold_tables(replies, gold, second, groups=groups, seed=seed, n_boot=n_boot, raters=raters)
    lines.insert(0, f"nsi-gold: {len(gold)} gold items from {gold_csv}")
    if out_dir is not None:
        from stats.nsi.figures import composition_figure, overcount_figure  # matplotlib only when writing

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        report = ["# Human coding: gold report\n", md_section("Headlines", "\n".join(f"- {x}" for x in lines))]
        report += [write_table(table, out, name, title) for name, (title, table) in tables.items()]
        overcount_figure(tables["gold_overcount"][1], out / "fig_overcount.png")
        composition_figure(tables["gold_composition"][1], out / "fig_composition.png")
        report.append("![over-count](fig_overcount.png)\n\n![composition](fig_composition.png)\n")
        (out / "gold_report.md").write_text("\n".join(report))
    return lines


def gold_tables(replies: pd.DataFrame, gold: pd.DataFrame, second: pd.DataFrame | None = None, *,
                groups: dict | None = None, seed: int = 0, n_boot: int = 2000,
                raters: tuple | None = None) -> tuple[dict, list[str]]:
    """Every gold table, name -> (title, rows), in report order, and the headline lines.

    ``replies``: the runs' replies with item ids; ``gold`` (and ``second``, a second file, or ``raters``, the
    pair of rater A and rater B labels, for reliability): as `read_labels`
    returns them.
    """
    cols = ["model", "dilemma_id", "domain", "framing", "negated", "temperature", "parse_ok", "decision", "endorse"]
    df = gold.join(replies.set_index("item_id")[cols], on="item_id")
    df["group"] = df["model"].map(groups) if groups else None
    coded = df[df["parse_ok"] & df["endorse"].notna()].copy()
    coded["proxy"] = coded["endorse"].astype(int)
    coded["gold_sup"] = (coded["action_stance"] == SUPPORTS).astype(int)
    tables: dict[str, tuple[str, pd.DataFrame]] = {}
    lines: list[str] = []
    for part in (_overcount(coded), _composition(coded), _proxy_agreement(coded, groups),
                 _poststratified(replies, coded), _conflicts(df, groups),
                 _reliability_of(gold, second, raters, seed, n_boot), _judge(df)):
        tables.update(part[0])
        lines += part[1]
    return tables, lines


def _overcount(coded: pd.DataFrame):
    """P(gold != SUPPORTS_X | proxy endorse) and P(gold = SUPPORTS_X | proxy not endorse), per framing and pooled."""
    endorse_rows, non_rows = coded[coded["proxy"] == 1], coded[coded["proxy"] == 0]
    rows = []
    for quantity, part, hit in (("over-count", endorse_rows, lambda s: s != SUPPORTS),
                                ("under-count", non_rows, lambda s: s == SUPPORTS)):
        for f in FRAMINGS:
            e = part[part["framing"] == f]
            rows.append(_prop_row(f, int(hit(e["action_stance"]).sum()), len(e), quantity=quantity))
        rows.append(_prop_row("pooled", int(hit(part["action_stance"]).sum()), len(part), quantity=quantity))
    over = pd.DataFrame(rows)
    po = over[(over["quantity"] == "over-count") & (over["stratum"] == "pooled")].iloc[0]
    lines = [f"proxy over-count: {po['rate']:.1%} ({int(po['k'])}/{int(po['n'])} proxy-endorse rows are not gold "
             f"SUPPORTS_X; Wilson 95% CI [{po['ci_low']:.1%}, {po['ci_high']:.1%}])"]
    by_f = over[(over["quantity"] == "over-count") & (over["stratum"] != "pooled") & (over["n"] > 0)]
    if len(by_f):
        lines.append("over-count by framing: " + ", ".join(f"{r.stratum} {r.rate:.1%} ({r.k}/{r.n})" for r in by_f.itertuples()))
    pu = over[(over["quantity"] == "under-count") & (over["stratum"] == "pooled")].iloc[0]
    lines.append(f"proxy under-count: {pu['rate']:.1%} ({int(pu['k'])}/{int(pu['n'])} proxy non-endorse rows are gold SUPPORTS_X)")
    title = "Proxy over-count P(gold != SUPPORTS_X | proxy endorse) and under-count, Wilson 95% CIs"
    return {"gold_overcount": (title, over)}, lines


def _composition(coded: pd.DataFrame):
    endorse_rows = coded[coded["proxy"] == 1]
    comp = (endorse_rows.groupby(["framing", "action_stance"]).size().unstack(fill_value=0)
            .reindex(columns=list(ACTION_STANCE), fill_value=0))
    comp.loc["pooled"] = comp.sum()
    return {"gold_composition": ("Gold action stance of proxy-endorse rows (Figure 2)", comp.reset_index())}, []


def _proxy_agreement(coded: pd.DataFrame, groups: dict | None):
    def row(stratum, g):
        return {"stratum": stratum, "n": len(g), "kappa": cohen_kappa(g["proxy"], g["gold_sup"], labels=[0, 1]),
                "accuracy": float((g["proxy"] == g["gold_sup"]).mean()) if len(g) else np.nan}

    rows = [row("pooled", coded)]
    for key in ["group", "model"] if groups else ["model"]:
        rows += [row(f"{key}={v}", g) for v, g in coded.groupby(key)]
    pk = pd.DataFrame(rows)
    lines = [f"proxy vs gold SUPPORTS_X: kappa {pk['kappa'].iloc[0]:.2f}, accuracy {pk['accuracy'].iloc[0]:.2f} (n={len(coded)})"]
    return {"gold_proxy_agreement": ("Binary proxy vs gold SUPPORTS_X: Cohen's kappa and accuracy", pk)}, lines


def _poststratified(replies: pd.DataFrame, coded: pd.DataFrame):
    """Gold SUPPORTS_X per framing: the sample's rates within proxy strata, weighted by the run's proxy shares."""
    sampled = replies[(replies["temperature"] > 0) & replies["parse_ok"]]
    rows = []
    for f in FRAMINGS:
        run_f = sampled[sampled["framing"] == f]
        g_f = coded[coded["framing"] == f]
        if run_f.empty or g_f.empty:
            continue
        w1 = float(run_f["endorse"].astype(float).mean())
        s1 = g_f[g_f["proxy"] == 1]["gold_sup"].mean() if (g_f["proxy"] == 1).any() else np.nan
        s0 = g_f[g_f["proxy"] == 0]["gold_sup"].mean() if (g_f["proxy"] == 0).any() else np.nan
        est = w1 * (s1 if w1 > 0 else 0.0) + (1 - w1) * (s0 if w1 < 1 else 0.0)
        rows.append({"framing": f, "proxy_rate_run": w1, "gold_sup_given_endorse": s1, "gold_sup_given_not": s0,
                     "gold_sup_poststratified": est, "n_coded": len(g_f)})
    post = pd.DataFrame(rows)
    lines = []
    if len(post):
        lines.append("post-stratified gold SUPPORTS_X: " + ", ".join(
            f"{r.framing} {r.gold_sup_poststratified:.0%}" for r in post.itertuples() if np.isfinite(r.gold_sup_poststratified)))
    title = "Post-stratified gold SUPPORTS_X rate per framing (proxy strata weighted by the run)"
    return {"gold_poststratified": (title, post)}, lines


def _conflicts(df: pd.DataFrame, groups: dict | None):
    """Decision-reasoning conflict rates (Wilson CIs) pooled, by framing, model, group and polarity; Fisher's test."""
    if "integrity" not in df.columns or not df["integrity"].notna().any():
        return {}, []
    it = df[df["integrity"].notna()]
    conflict = it["integrity"] == CONFLICT
    rows = [_prop_row("pooled", int(conflict.sum()), len(it), by="all")]
    strata = [("framing", list(FRAMINGS)), ("model", sorted(it["model"].unique()))]
    if groups:
        strata.append(("group", sorted(it["group"].dropna().unique())))
    for by, values in strata:
        for v in values:
            m = it[by] == v
            rows.append(_prop_row(v, int(conflict[m].sum()), int(m.sum()), by=by))
    neg = it["framing"].map(NEGATED).astype(bool)
    table = [[int(conflict[neg].sum()), int((~conflict[neg]).sum())], [int(conflict[~neg].sum()), int((~conflict[~neg]).sum())]]
    rows.append(_prop_row("negated (F1, F3)", table[0][0], int(neg.sum()), by="polarity"))
    rows.append(_prop_row("affirmative (F0, F2)", table[1][0], int((~neg).sum()), by="polarity"))
    conf = pd.DataFrame(rows)
    odds, p_fisher = (sps.fisher_exact(table) if neg.any() and (~neg).any() else (np.nan, np.nan))
    conf["fisher_p_negated_vs_affirmative"] = np.where(conf["by"] == "polarity", p_fisher, np.nan)
    pc = conf.iloc[0]
    lines = [f"decision-reasoning conflicts: {pc['rate']:.1%} ({int(pc['k'])}/{int(pc['n'])}; Wilson 95% CI "
             f"[{pc['ci_low']:.1%}, {pc['ci_high']:.1%}]); negated vs affirmative Fisher p = {p_fisher:.2g}"]
    title = "Decision-reasoning conflict rates (Wilson 95% CIs; Fisher exact negated vs affirmative)"
    out = {"gold_conflicts": (title, conf)}
    if groups:
        per_model = conf[conf["by"] == "model"].set_index("stratum")["rate"].to_dict()
        perm = conflict_permutation(per_model, groups)
        if len(perm):
            out["gold_conflict_permutation"] = ("Per-model conflict rates, each group vs the rest: exact one-sided "
                                                "permutation test (sec. 4.2)", perm)
            lines += [f"conflicts, {r.group} vs the rest (per-model rates {r.mean_group:.1%} vs {r.mean_rest:.1%}): "
                      f"exact one-sided permutation p = {r.p_one_sided_exact:.3g}" for r in perm.itertuples()]
    return out, lines


def conflict_permutation(rates: dict, groups: dict) -> pd.DataFrame:
    """Sec. 4.2: "an exact permutation test on the 16 per-model conflict rates (open-source vs. the rest,
    one-sided)". For each group label: the mean per-model rate of the group minus that of the other models,
    its exact one-sided p ('greater') over every split of the models (``scipy.stats.permutation_test``,
    independent samples, all partitions)."""
    models = [m for m in rates if groups.get(m) is not None and np.isfinite(rates[m])]
    x = np.array([rates[m] for m in models], dtype=float)
    rows = []
    for label in sorted({groups[m] for m in models}, key=str):
        inside = np.array([groups[m] == label for m in models])
        if inside.sum() < 2 or (~inside).sum() < 2:  # scipy needs two models a side; too few to test anyway
            continue
        res = sps.permutation_test((x[inside], x[~inside]), lambda a, b, axis: a.mean(axis=axis) - b.mean(axis=axis),
                                   permutation_type="independent", alternative="greater", n_resamples=np.inf,
                                   vectorized=True)
        rows.append({"group": label, "n_group": int(inside.sum()), "n_rest": int((~inside).sum()),
                     "mean_group": float(x[inside].mean()), "mean_rest": float(x[~inside].mean()),
                     "difference": float(res.statistic), "p_one_sided_exact": float(res.pvalue)})
    return pd.DataFrame(rows)


def _reliability_of(gold, second, raters, seed: int, n_boot: int):
    """Rater A vs rater B when given, else the gold file vs a second file, else nothing."""
    if raters is not None:
        return _reliability(*raters, seed, n_boot)
    return _reliability(gold, second, seed, n_boot) if second is not None else ({}, [])


def _reliability(gold: pd.DataFrame, second: pd.DataFrame, seed: int, n_boot: int):
    """Two raters on the items both coded: raw agreement, Cohen's kappa, Krippendorff's alpha (item-bootstrap CI), AC1."""
    both = gold.merge(second, on="item_id", suffixes=("_a", "_b"))
    rows, lines = [], []
    for axis, cats in AXES.items():
        if f"{axis}_a" in both and f"{axis}_b" in both:
            ag = agreement(both[f"{axis}_a"], both[f"{axis}_b"], cats, n_boot=n_boot,
                           rng=rng_for(seed, len(axis), mix=ENTROPY))
            rows.append({"axis": axis, "n": ag.n, "raw_agreement": ag.raw, "cohen_kappa": ag.kappa,
                         "krippendorff_alpha": ag.alpha, "alpha_ci_low": ag.alpha_ci_low,
                         "alpha_ci_high": ag.alpha_ci_high, "gwet_ac1": ag.ac1})
            lines.append(f"reliability ({axis}, n={ag.n}): alpha {ag.alpha:.3f} [{ag.alpha_ci_low:.2f}, {ag.alpha_ci_high:.2f}], "
                         f"kappa {ag.kappa:.3f}, AC1 {ag.ac1:.3f}, raw {ag.raw:.3f}")
    return {"gold_reliability": ("Two-rater reliability (alpha CI: item bootstrap)", pd.DataFrame(rows))}, lines


def _judge(df: pd.DataFrame):
    """An automated judge's labels against gold: macro-F1 (the paper's gate 0.70) and per-class F1."""
    rows, lines = [], []
    for axis, cats in AXES.items():
        jcol = f"judge_{axis}"
        if jcol in df.columns and df[jcol].notna().any() and axis in df.columns:
            sub = df[df[jcol].notna() & df[axis].notna()]
            present = [c for c in cats if c in set(sub[axis]) | set(sub[jcol])]
            mf1, per = macro_f1(sub[axis], sub[jcol], labels=present)
            never = [c for c in cats if c in set(sub[axis]) and c not in set(sub[jcol])]
            rows.append({"axis": axis, "n": len(sub), "macro_f1": mf1, "accuracy": float((sub[axis] == sub[jcol]).mean()),
                         "passes_gate": mf1 >= JUDGE_GATE, "never_predicted": ", ".join(never),
                         **{f"f1_{c}": per.get(c, np.nan) for c in cats}})
            lines.append(f"judge ({axis}): macro-F1 {mf1:.3f} ({'passes' if mf1 >= JUDGE_GATE else 'fails'} the {JUDGE_GATE:.2f} gate), "
                         f"accuracy {rows[-1]['accuracy']:.3f}" + (f"; never predicts {', '.join(never)}" if never else ""))
    if not rows:
        return {}, []
    return {"gold_judge": ("Judge vs gold: macro-F1 (gate 0.70) and per-class F1", pd.DataFrame(rows))}, lines
