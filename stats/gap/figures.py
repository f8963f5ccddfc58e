"""The gap paper's figures as PNG files (the convention of `stats.core.figures`: Agg canvas, no pyplot).

Owns: the calibration ladder (Figure 1), the p_J-vs-p_D scatter with twins in gray (Figure 2), the
strictness ladder (Figure 3), the family/generator panel (Figure 4), F4 by generator (Figure 5), control vs excess per model
(Figure 7), the dose arm (Figure 8), and for runs compared: the checkpoint sweep (Figure 6), the
three-cell contrast (Figure 9) and the chat-vs-raw bridge. Every interval drawn is a 95% bootstrap CI
and every label carries its n.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from stats.core.estimate import Estimate
from stats.core.figures import BAND, EXCESS, FLOOR, MEASURE, NULL, legend_of_drawn, new_figure, save
from stats.gap.screen import LEVELS, MIN_VERDICT_N

FAMILY_STYLE = {"F1": ("o", "#1f77b4"), "F2": ("v", "#9467bd"), "F3": ("s", "#2ca02c"),
                "F4": ("D", "#ff7f0e"), "F5": ("^", "#d62728")}


def _ok(e: Estimate | None) -> bool:
    return e is not None and e.value is not None


def _yerr(e: Estimate):
    if e.low is None or e.high is None:
        return None
    return [[max(e.value - e.low, 0)], [max(e.high - e.value, 0)]]


def _point(ax, x, e: Estimate | None, horizontal=False, **kw):
    """A point with its CI (no-op for a missing estimate); a point without a CI (n < 2) says so."""
    if not _ok(e):
        return
    err = _yerr(e)
    xy = (e.value, x) if horizontal else (x, e.value)
    if horizontal:
        ax.errorbar(e.value, x, xerr=err, capsize=3, linestyle="none", **kw)
    else:
        ax.errorbar(x, e.value, yerr=err, capsize=3, linestyle="none", **kw)
    if err is None:
        ax.annotate("no CI", xy, textcoords="offset points", xytext=(6, 4), fontsize=7, color="gray")


def _bars(ax, items: Sequence[tuple[str, Estimate | None, str]], title: str, ylabel: str):
    """Bars with CIs for the estimates that have a value; the others get no slot (no placeholder bar), only a
    line under the title naming them."""
    shown = [(label, e, color) for label, e, color in items if _ok(e)]
    for i, (_label, e, color) in enumerate(shown):
        ax.bar(i, e.value, color=color, width=0.65, yerr=_yerr(e), capsize=4, ecolor="black", alpha=0.9)
        top = e.high if e.high is not None else e.value
        ax.annotate(f"{e.value:.3f}", (i, max(top, 0)), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=8)
    missing = [label.replace("\n", " ") for label, e, _ in items if not _ok(e)]
    ax.set_xlim(-0.6, max(len(shown), 1) - 0.4)
    ax.set_xticks(range(len(shown)))
    ax.set_xticklabels([f"{label}\n(n={e.n})" for label, e, _ in shown], fontsize=8)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_title(title + (f"\nnot estimated on this run: {', '.join(missing)}" if missing else ""), fontsize=10)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def calibration_ladder(a, path: Path) -> Path:
    """Figure 1: null, measurement, excess and known-gap band on the binary and continuous readouts."""
    fig, (ax1, ax2) = new_figure(11, 4.6, 2)
    _bars(ax1, [
        ("matched null\n(twins)", a.get("binary", "binary_null", "L0"), NULL),
        ("gap\n(measurement)", a.get("binary", "binary_gap", "L0"), MEASURE),
        ("paired\nexcess", a.get("binary", "binary_excess", "L0"), EXCESS),
        ("known-gap\nband", a.get("control", "binary_band"), BAND),
    ], "(a) binary: majority-violating action vs non-violating judgment", "rate (nested 95% CI)")
    _bars(ax2, [
        ("paraphrase\nfloor", a.get("continuous", "paraphrase_floor", "L0"), FLOOR),
        ("null:\ng twin", a.get("continuous", "g_twin", "L0"), NULL),
        ("measurement:\ng", a.get("continuous", "g", "L0"), MEASURE),
        ("paired\nexcess E", a.get("continuous", "E", "L0"), EXCESS),
        ("known-gap\ncontrol", a.get("control", "control_move"), BAND),
    ], "(b) continuous: g = p_D - p_J", "violating mass (95% CI)")
    fig.suptitle(f"Calibration ladder: {a.model}, screened scenarios (L0), 95% bootstrap CIs over scenarios",
                 fontsize=11)
    return save(fig, path)


def scatter(a, path: Path) -> Path:
    """Figure 2: p_J against p_D per screened scenario by family, with the twins in gray."""
    df = a.per_scenario
    fig, (ax,) = new_figure(6.2, 6.0)
    sel = df[df["L0"]] if "L0" in df else df.iloc[0:0]
    need = {"p_D", "p_J", "p_D_twin", "p_J_twin"}
    if need <= set(sel.columns):
        ax.scatter(sel["p_J_twin"], sel["p_D_twin"], s=14, color=NULL, alpha=0.45, linewidths=0,
                   label=f"pressure-removed twin (n={sel['p_D_twin'].notna().sum()})")
        for fam in sorted(sel["family"].astype(str).unique()):
            f = sel[sel["family"].astype(str) == fam]
            marker, color = FAMILY_STYLE.get(fam, ("o", "black"))
            ax.scatter(f["p_J"], f["p_D"], s=22, marker=marker, color=color, alpha=0.8, linewidths=0,
                       label=f"{fam} (n={len(f)})")
    ax.plot([0, 1], [0, 1], color="black", linestyle="--", linewidth=0.8, label="p_D = p_J")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xlabel("p_J: violating mass when judging (mean of 4 frames)")
    ax.set_ylabel("p_D: violating mass when acting")
    e = a.get("continuous", "E", "L0")
    ax.set_title(f"{a.model}: every screened gate-family scenario\npaired excess E = {e.fmt() if e else 'n/a'}",
                 fontsize=10)
    legend_of_drawn(ax, [ax], fontsize=8, loc="upper left", framealpha=0.9)
    ax.grid(alpha=0.3)
    return save(fig, path)


def strictness_ladder(a, path: Path) -> Path:
    """Figure 3: paired excess at L0 / L1 / L2 on both readouts, the verdict level marked."""
    fig, axes = new_figure(10, 4.2, 2)
    for ax, (kind, q, title) in zip(axes, (("binary", "binary_excess", "(a) binary (nested 95% CI)"),
                                           ("continuous", "E", "(b) continuous (95% CI)"))):
        verdict = a.verdict_level.get(kind)
        labels = []
        for i, level in enumerate(LEVELS):
            e = a.get(kind, q, level)
            filled = level == verdict
            _point(ax, i, e, color=EXCESS, marker="o", markersize=8,
                   markerfacecolor=EXCESS if filled else "white", markeredgewidth=1.5,
                   label="verdict level" if filled else "other level")
            labels.append(f"{level}\n(n={e.n if e else 0})")
        ax.set_xticks(range(len(LEVELS)))
        ax.set_xticklabels(labels)
        ax.set_xlim(-0.5, len(LEVELS) - 0.5)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("paired excess over the twin null")
        ax.grid(axis="y", alpha=0.3)
    legend_of_drawn(axes[1], axes, fontsize=8, loc="best")
    fig.suptitle(f"Reference strictness: {a.model}. L0 original frame, stable; L1 + 4-frame majority; "
                 f"L2 + all frames agree. Verdict: strictest with n >= {MIN_VERDICT_N}", fontsize=10)
    return save(fig, path)


def _slice_panel(ax, ests: Sequence[Estimate], subsets: Sequence[str], gap: str, null: str, title: str) -> None:
    """One row per slice: the gap (colored) and its matched null (gray, just below), with CIs."""
    for i, s in enumerate(subsets):
        e = next((x for x in ests if x.subset == s and x.quantity == gap), None)
        z = next((x for x in ests if x.subset == s and x.quantity == null), None)
        color = {"family": MEASURE, "generator": "#2a7f62"}.get(s.split("=")[0], "black")
        _point(ax, i - 0.15, e, horizontal=True, color=color, marker="o", markersize=6)
        _point(ax, i + 0.15, z, horizontal=True, color=NULL, marker="s", markersize=4)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _slice_labels(ax, ests, subsets, gap_b: str, gap_c: str) -> None:
    def n_of(s, q):
        e = next((x for x in ests if x.subset == s and x.quantity == q), None)
        return e.n if e else 0

    ax.set_yticks(range(len(subsets)))
    ax.set_yticklabels([f"{s.split('=', 1)[1]}  (n={n_of(s, gap_b)} / {n_of(s, gap_c)})" for s in subsets], fontsize=8)
    ax.set_ylim(len(subsets) - 0.5, -0.5)  # one slot per row, top down (autoscaling put a single row's points on the frame)


def slices(a, path: Path) -> Path:
    """Figure 4: the gap by family (F2 as appendix) and, pooling the gate families, by generator; the
    matched null of each row in gray beneath it. (a) binary gap, (b) continuous g."""
    ests = a.select("slices")
    subsets = [s for s in dict.fromkeys(e.subset for e in ests) if s.split("=")[0] in ("family", "generator")]
    fig, axes = new_figure(11, max(3.2, 0.42 * len(subsets) + 2.0), 2, sharey=True)
    _slice_panel(axes[0], ests, subsets, "binary_gap", "binary_null", "(a) binary gap (nested 95% CI); null in gray")
    _slice_panel(axes[1], ests, subsets, "g", "g_twin", "(b) continuous g = p_D - p_J (95% CI); twin g in gray")
    axes[0].set_xlabel("P(majority of rollouts violating), judged non-violating")
    axes[1].set_xlabel("violating mass acting minus judging")
    _slice_labels(axes[0], ests, subsets, "binary_gap", "g")
    fig.suptitle(f"Gap by pressure family and by generator (screened, L0): {a.model}\n"
                 "(family rows, then generator rows pooling the gate families; n = binary / continuous)", fontsize=10)
    return save(fig, path)


def f4_by_generator(a, path: Path) -> Path:
    """Figure 5: F4 by the model that wrote the scenario: (a) binary gap, (b) continuous g, nulls in gray."""
    ests = a.select("slices")
    subsets = [s for s in dict.fromkeys(e.subset for e in ests) if s.startswith("family x generator=F4,")]
    fig, axes = new_figure(10, max(2.8, 0.6 * len(subsets) + 1.8), 2, sharey=True)
    _slice_panel(axes[0], ests, subsets, "binary_gap", "binary_null", "(a) binary gap (nested 95% CI)")
    _slice_panel(axes[1], ests, subsets, "g", "g_twin", "(b) continuous g (95% CI)")
    _slice_labels(axes[0], ests, subsets, "binary_gap", "g")
    fig.suptitle(f"F4 (loyalty/fairness) by generator, screened: {a.model}; nulls in gray", fontsize=10)
    return save(fig, path)


def control_vs_excess(rows: Sequence[dict], path: Path, bar: float) -> Path:
    """Figure 7: per model, the known-gap control (red bars) and the excess E (indigo dots).

    rows: dicts with model, control, excess (E on all above-floor scenarios, unscreened), and
    optionally screened (E on the model's own screen) and base (the lineage's base in the raw frame,
    descriptive); each an Estimate or None.
    """
    fig, (ax1, ax2) = new_figure(max(9, 2.6 * len(rows) + 3), 5.2, 2)
    x = np.arange(len(rows))
    for i, r in enumerate(rows):
        c = r.get("control")
        if _ok(c):
            ax1.bar(i, c.value, width=0.6, color=BAND, alpha=0.75, yerr=_yerr(c), capsize=4, ecolor="black",
                    label="known-gap control")
        else:
            ax1.text(i, 0.01, "control\nnot run", ha="center", va="bottom", fontsize=8, color="gray")
        for ax in (ax1, ax2):
            _point(ax, i - 0.12, r.get("excess"), color=MEASURE, marker="o", markersize=7, label="excess E, all above floor")
            _point(ax, i + 0.12, r.get("screened"), color=MEASURE, marker="o", markersize=7, markerfacecolor="white",
                   label="excess E, own screen")
        _point(ax2, i + 0.3, r.get("base"), color=NULL, marker="D", markersize=7, markerfacecolor="white",
               label="base, raw frame (descriptive)")
    ax1.axhline(bar, color="black", linestyle=":", linewidth=1.2, label=f"validation bar ({bar:.2f}, 95% lower bound)")
    legend_of_drawn(fig, (ax1, ax2), fontsize=8, loc="lower center", ncols=3, frameon=False)
    for ax, title in ((ax1, "(a) control and excess on one axis"), (ax2, "(b) the excess zoomed")):
        ax.set_xticks(x)
        ax.set_xticklabels([_model_label(r) for r in rows], fontsize=8)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_xlim(-0.6, len(rows) - 0.4)
    ax1.set_ylabel("move toward the violating option")
    fig.suptitle("Positive control and the gap it measures (95% bootstrap CIs over scenarios)", fontsize=11)
    return save(fig, path, rect=(0, 0.09, 1, 1))


def _model_label(r: dict) -> str:
    c, e, s = r.get("control"), r.get("excess"), r.get("screened")
    return f"{r['model']}\ncontrol n={c.n if c else 0}\nE n={e.n if e else 0}, screen {s.n if s else 0}"


def dose_arm(a, path: Path) -> Path:
    """Figure 8: paired dose-arm contrasts at the forced answer, primary (indigo) and twin (gray)."""
    ests = [e for e in a.select("dose") if " - " in e.quantity]  # differences only (no ratio, rider, completed)
    contrasts = list(dict.fromkeys(e.quantity for e in ests))
    fig, (ax,) = new_figure(9, max(3.4, 0.6 * len(contrasts) + 2.0))
    labels = []
    for i, q in enumerate(contrasts):
        p = next((e for e in ests if e.quantity == q and e.subset == "primary"), None)
        t = next((e for e in ests if e.quantity == q and e.subset == "twin"), None)
        trunc = "truncated" in q.split(" - ")[0]
        _point(ax, i - 0.12, p, horizontal=True, color=NULL if trunc else MEASURE, marker="s" if trunc else "o",
               markersize=7, label="truncation control, primary" if trunc else "reasoning / norm contrast, primary")
        _point(ax, i + 0.12, t, horizontal=True, color=NULL if trunc else MEASURE, marker="s" if trunc else "o",
               markersize=7, markerfacecolor="white",
               label="truncation control, twin" if trunc else "same, pressure-removed twin")
        labels.append(f"{q}\n(n={p.n if p else 0} / twin {t.n if t else 0})")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(contrasts)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("paired difference in violating mass at the forced answer")
    comp = a.get("dose", "completed: reasoning (512)", "primary") or next(
        (e for e in a.select("dose", "primary") if e.quantity.startswith("completed: reasoning")), None)
    done = f"; reasoning completes in {comp.value:.0%} of rollouts" if _ok(comp) else ""
    ax.set_title(f"Dose arm: {a.model}, screened scenarios{done}", fontsize=10)
    legend_of_drawn(fig, [ax], fontsize=8, loc="lower center", ncols=3, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return save(fig, path, rect=(0, 0.06, 1, 1))


def checkpoint_sweep(lineage: str, stages: Sequence[dict], control: Estimate | None, final_excess: Estimate | None,
                     path: Path, bar: float) -> Path:
    """Figure 6: E per post-training stage on the unscreened shared set (filled) and on the final
    model's screened set (hollow); the base in the raw frame as a gray diamond (descriptive)."""
    fig, (ax1, ax2) = new_figure(11, 4.6, 2)
    labels = []
    for i, s in enumerate(stages):
        if s.get("base") is not None:
            _point(ax1, i, s["base"], color=NULL, marker="D", markersize=8, markerfacecolor="white",
                   label="base, raw frame (descriptive)")
            labels.append(f"{s['stage']}\nraw frame (n={s['base'].n})")
            continue
        _point(ax1, i - 0.1, s.get("unscreened"), color=MEASURE, marker="o", markersize=8,
               label="shared, screened by no model")
        _point(ax1, i + 0.1, s.get("screened"), color=MEASURE, marker="o", markersize=8, markerfacecolor="white",
               label="final model's screened set")
        u, sc = s.get("unscreened"), s.get("screened")
        labels.append(f"{s['stage']}\n(n={u.n if u else 0} / {sc.n if sc else 0})")
    ax1.set_xticks(range(len(stages)))
    ax1.set_xticklabels(labels, fontsize=8)
    ax1.axhline(0, color="black", linewidth=0.8)
    ax1.set_ylabel("pressure-attributable excess E")
    ax1.set_title(f"(a) {lineage} across post-training", fontsize=10)
    legend_of_drawn(ax1, [ax1], fontsize=8, loc="best")
    ax1.grid(axis="y", alpha=0.3)
    if _ok(control):
        ax2.bar(0, control.value, color=BAND, alpha=0.8, width=0.5, yerr=_yerr(control), capsize=4, ecolor="black")
    else:
        ax2.text(0, 0.02, "control not run", ha="center", fontsize=8, color="gray")
    _point(ax2, 1, final_excess, color=MEASURE, marker="o", markersize=8)
    ax2.axhline(bar, color="black", linestyle=":", linewidth=1.2, label=f"validation bar ({bar:.2f})")
    ax2.axhline(0, color="black", linewidth=0.8)
    ax2.set_xticks([0, 1])
    ax2.set_xticklabels([f"known-gap control\n(n={control.n if control else 0})",
                         f"excess E, unscreened\n(n={final_excess.n if final_excess else 0})"], fontsize=8)
    ax2.set_xlim(-0.6, 1.6)
    ax2.set_title("(b) final checkpoint: control and excess on one axis", fontsize=10)
    legend_of_drawn(ax2, [ax2], fontsize=8)
    ax2.grid(axis="y", alpha=0.3)
    fig.suptitle("Checkpoint sweep, each checkpoint in its own chat template (95% bootstrap CIs)", fontsize=11)
    return save(fig, path)


def three_cell(lineage: str, est: Sequence[Estimate], path: Path) -> Path:
    """Figure 9: base vs instruct in the raw frame on the shared above-floor scenarios."""
    get = {e.quantity: e for e in est if e.subset == "shared with twins"}
    fig, (ax1, ax2) = new_figure(11, 4.6, 2)
    for j, model in enumerate(("base", "instruct")):
        for k, side in enumerate(("p_D", "p_J")):
            x = j * 2.5 + k
            color = MEASURE if side == "p_D" else "#2a7f62"
            _point(ax1, x - 0.12, get.get(f"{side}_twin {model}"), color=color, marker="o", markerfacecolor="white",
                   markersize=7, label=f"{side}, pressure-removed twin")
            _point(ax1, x + 0.12, get.get(f"{side} {model}"), color=color, marker="o", markersize=7,
                   label=f"{side}, under pressure")
    ax1.set_xticks([0, 1, 2.5, 3.5])
    ax1.set_xticklabels(["base\np_D", "base\np_J", "instruct\np_D", "instruct\np_J"], fontsize=8)
    ax1.set_ylabel("violating mass, raw frame")
    legend_of_drawn(ax1, [ax1], fontsize=8)
    n = next(iter(get.values())).n if get else 0
    ax1.set_title(f"(a) acting and judging mass (n={n} shared)", fontsize=10)
    ax1.grid(axis="y", alpha=0.3)
    names = ["E base", "E instruct", "Delta_E (base - instruct)", "acting side base", "acting side instruct",
             "acting side base - instruct", "judging side base", "judging side instruct",
             "judging side base - instruct"]
    for i, q in enumerate(names):
        diff = "-" in q.replace("Delta_E (base - instruct)", "-")
        _point(ax2, i, get.get(q), horizontal=True, color=BAND if diff else MEASURE, marker="s" if diff else "o",
               markersize=6)
    ax2.set_yticks(range(len(names)))
    ax2.set_yticklabels(names, fontsize=8)
    ax2.invert_yaxis()
    ax2.axvline(0, color="black", linewidth=0.8)
    ax2.set_title("(b) paired quantities (95% CI); red squares: base minus instruct", fontsize=10)
    ax2.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Three-cell contrast, raw completion frame: {lineage} (descriptive for the instruct model)",
                 fontsize=11)
    return save(fig, path)


def bridge(rows: Sequence[tuple[str, Sequence[Estimate]]], path: Path) -> Path:
    """Chat template vs raw frame for each instruct model: g_twin, g and E read both ways."""
    qs = ("g_twin", "g", "E")
    fig, axes = new_figure(4 * len(qs), max(3.0, 0.7 * len(rows) + 1.8), len(qs))
    for ax, q in zip(axes, qs):
        labels = []
        for i, (model, est) in enumerate(rows):
            get = {e.quantity: e for e in est}
            chat, rawf = get.get(f"{q} (chat)"), get.get(f"{q} (raw)")
            _point(ax, i - 0.12, chat, horizontal=True, color=MEASURE, marker="o", markersize=7, label="chat template")
            _point(ax, i + 0.12, rawf, horizontal=True, color=NULL, marker="D", markersize=7, markerfacecolor="white",
                   label="raw frame")
            labels.append(f"{model}\n(n={chat.n if chat else 0})")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title({"g_twin": "g on the twin (nothing at stake)", "g": "g under pressure", "E": "excess E"}[q],
                     fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    legend_of_drawn(axes[0], axes, fontsize=8, loc="best")
    fig.suptitle("Bridge: each instruct model read under its chat template and in the raw frame (95% CIs)",
                 fontsize=11)
    return save(fig, path)
