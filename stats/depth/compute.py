"""Through depth (pure): per layer p_D, p_J0, g and the paired excess E with the paired scenario bootstrap, the
departure layer with a nested bootstrap CI, and the patch-closure curve of each patch source with its CI.

Definitions (this project's extension of the gap paper; docs/paper-map.md):
- At layer l a scenario's p_D(l) (p_J0(l)) is its violating mass normalized over the letters, through the logit
  lens at l, averaged over its option orders; g(l) = p_D(l) - p_J0(l) per cell; E(l) = mean over scenarios of
  g_primary(l) - g_twin(l), on the scenarios read in both cells at every layer (the paper's paired excess, at l).
- A layer is readable through a lens when the lens puts at least `min_letter_mass` (mean over the layer's paired D
  and J0 reads) on the letters, and, where `max_kl` is set, its mean KL to the final layer is at most that; the last
  layer (the model's own read) is always readable. E near 0 at an unreadable layer says the lens cannot read the
  letters there, not that there is no gap: such a layer neither departs nor interrupts a departure.
- The departure layer is the first readable layer from which E's 95% CI lies outside +-bound at that layer and every
  later readable one (None when the last layer's does not), bound = max(delta, final_share x |E at the last layer|):
  a minimum effect size, so that an effect of a thousandth with a narrow CI is no departure. Its CI: the same rule
  (same bound and readable layers) applied inside each resample of an outer bootstrap over scenarios, with an inner
  bootstrap for the per-layer CIs (percentiles of the outer resamples' departures).
- E's simultaneous band over layers (stats.core.bootstrap.simultaneous_band: studentized bootstrap, min-p
  calibrated) covers the whole curve at once with about 95% probability. "E is 0 at every layer below b" is a claim
  about all those layers together, so it is read from the band (`band_excludes_zero`): where E is 0 at each of 20
  layers, their per-layer CIs exclude 0 somewhere far more often than 5% of the time (64% for exact intervals on
  independent layers). The departure rule keeps the per-layer CIs: its claim, "E is not 0 at this layer and at
  every later one", holds only if every one of those CIs excludes 0, which needs no correction (an
  intersection-union test).
- Closure at layer l of a source: sum over scenarios of (p_agent - p_patched(l)) over the sum of
  (p_agent - p_source) of the same scenario's judge patch (its p_D - p_J0 in the patched orders): the share of the
  gap the patch closes, a ratio of means (a scenario whose own gap is near 0 does not blow it up).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract.names import DEPTH_CELLS, LENSES, PATCH_SOURCES
from contract.readouts import readout
from stats.core.bootstrap import scenario_bootstrap, simultaneous_band

AGENT, JUDGE = readout("D").name, readout("J0").name
"""The readouts whose depth profiles the excess compares (D and the letter-only judge)."""
QUANTITIES = ("p_D", "p_J0", "g", "E")
"""Per layer, the quantities of depth_layers.csv: p_D, p_J0, g of the primary cell, and E."""


@dataclass(frozen=True)
class DepartureRule:
    """The departure rule's minimum effect size and readability mask (module docstring)."""

    delta: float = 0.02
    """E's CI must lie outside +-delta (and outside +-final_share x |E at the last layer|)."""
    final_share: float = 0.0
    """A share of the last layer's |E| the CI must also clear (0: delta alone)."""
    min_letter_mass: float = 0.05
    """A layer is readable where the lens puts at least this mass on the letters (mean over its reads)."""
    max_kl: float | None = None
    """Where set, a readable layer's mean KL to the final layer (nats) is at most this."""


@dataclass(frozen=True)
class Departure:
    """The departure layer and its bootstrap CI."""

    layer: int | None
    """First layer from which E's CI excludes 0 at every later layer; None: no departure."""
    low: float
    """2.5th percentile of the resampled departure layers (NaN when fewer than 2 resamples depart)."""
    high: float
    """97.5th percentile; inf when more than 2.5% of resamples have no departure."""
    p_none: float
    """Share of the outer resamples without a departure."""
    n_outer: int
    n_inner: int
    bound: float = 0.0
    """The minimum effect size the CIs had to clear (DepartureRule)."""
    unreadable: tuple = ()
    """The layers the rule skipped as unreadable."""


def first_departure(low: np.ndarray, high: np.ndarray, bound: float = 0.0, readable: np.ndarray | None = None) -> int | None:
    """The first readable index from which every readable interval [low, high] lies outside +-bound (None when the
    last readable one does not); unreadable indices are skipped, neither departing nor interrupting."""
    excludes = (np.asarray(low) > bound) | (np.asarray(high) < -bound)
    keep = np.flatnonzero(np.ones(len(excludes), bool) if readable is None else np.asarray(readable, bool))
    if len(keep) == 0 or not excludes[keep[-1]]:
        return None
    k = len(keep)
    while k > 0 and excludes[keep[k - 1]]:
        k -= 1
    return int(keep[k])


def readability(depth: pd.DataFrame, rule: DepartureRule, lens: str = LENSES[0]) -> pd.DataFrame:
    """Per layer through `lens`: the mean letter mass and KL to the final layer over the D and J0 reads, and whether
    the layer is readable (module docstring)."""
    d = depth[(depth.lens == lens) & depth.readout.isin((AGENT, JUDGE))]
    kl = d["kl_final"] if "kl_final" in d else pd.Series(np.nan, index=d.index)
    out = pd.DataFrame({"letter_mass": d.groupby("layer").letter_mass.mean(),
                        "kl_final": kl.groupby(d.layer).mean()}).reset_index()
    ok = out.letter_mass >= rule.min_letter_mass
    if rule.max_kl is not None:
        ok &= out.kl_final.fillna(np.inf) <= rule.max_kl
    out["readable"] = ok | (out.layer == out.layer.max())
    return out


def departure_bound(estimates: pd.DataFrame, rule: DepartureRule) -> float:
    """max(delta, final_share x |E at the last layer|)."""
    e = estimates[estimates.quantity == "E"].sort_values("layer")
    final = abs(float(e.value.iloc[-1])) if len(e) else 0.0
    return max(rule.delta, rule.final_share * final)


def band_excludes_zero(estimates: pd.DataFrame, quantity: str = "E") -> list[int]:
    """The layers at which `quantity`'s simultaneous band (depth_estimates' band_low/band_high) excludes 0; empty when
    it covers 0 at every layer (no layer's value is distinguishable from 0 at once: not evidence that it is 0)."""
    return [layer for layer, lo, hi in _band(estimates, quantity) if lo > 0 or hi < 0]


def band_unbounded(estimates: pd.DataFrame, quantity: str = "E") -> list[int]:
    """The layers at which `quantity`'s simultaneous band is infinite: so many scenarios share one value there that
    the studentized bootstrap cannot bound it (stats.core.bootstrap.simultaneous_band). Such a band covers 0 without
    saying anything; the report names these layers."""
    return [layer for layer, lo, hi in _band(estimates, quantity) if not (np.isfinite(lo) and np.isfinite(hi))]


def _band(estimates: pd.DataFrame, quantity: str) -> list[tuple[int, float, float]]:
    """(layer, band_low, band_high) of `quantity`, by layer."""
    q = estimates[estimates.quantity == quantity].sort_values("layer")
    return [(int(layer), lo, hi) for layer, lo, hi in zip(q.layer, q.band_low, q.band_high)]


def layer_matrix(depth: pd.DataFrame, readout: str, cell: str, lens: str = LENSES[0]) -> pd.DataFrame:
    """Scenarios x layers: p_violating through `lens` averaged over option orders."""
    d = depth[(depth.readout == readout) & (depth.cell == cell) & (depth.lens == lens)]
    return d.groupby(["scenario_id", "layer"]).p_violating.mean().unstack("layer").sort_index()


def paired_columns(depth: pd.DataFrame, lens: str = LENSES[0]) -> tuple[np.ndarray, list, np.ndarray]:
    """(layers, scenario ids, values [S, 4, layers]: p_D, p_J0, g of the primary cell and E) on the scenarios read
    in both primary and twin by both readouts at every layer."""
    primary, twin = DEPTH_CELLS[0], DEPTH_CELLS[1]
    m = {(r, c): layer_matrix(depth, r, c, lens) for r in (AGENT, JUDGE) for c in (primary, twin)}
    layers = sorted(set.intersection(*(set(x.columns) for x in m.values()))) if all(len(x) for x in m.values()) else []
    ids = sorted(set.intersection(*(set(x.dropna(subset=layers).index) for x in m.values()))) if layers else []
    if not ids:
        return np.array(layers, dtype=int), [], np.zeros((0, 4, len(layers)))
    take = {k: x.loc[ids, layers].to_numpy(dtype=float) for k, x in m.items()}
    g_p = take[(AGENT, primary)] - take[(JUDGE, primary)]
    g_t = take[(AGENT, twin)] - take[(JUDGE, twin)]
    values = np.stack([take[(AGENT, primary)], take[(JUDGE, primary)], g_p, g_p - g_t], axis=1)
    return np.array(layers, dtype=int), ids, values


def depth_estimates(depth: pd.DataFrame, rng: np.random.Generator, n_boot: int, lens: str = LENSES[0]) -> pd.DataFrame:
    """depth_layers.csv: one row per layer x quantity (QUANTITIES) through `lens`: value, 95% CI, SE, n scenarios, and
    the quantity's 95% simultaneous band over the layers (band_low, band_high: module docstring)."""
    layers, ids, values = paired_columns(depth, lens)
    rows = []
    if not ids:
        return pd.DataFrame(columns=["layer", "quantity", "value", "low", "high", "se", "n", "band_low", "band_high"])
    s, q, n_layers = values.shape
    value, low, high, se = scenario_bootstrap(values.reshape(s, q * n_layers), rng, n_boot)
    bands = [simultaneous_band(values[:, qi, :], rng, n_boot) for qi in range(q)]  # drawn after: the CIs' stream kept
    for qi, name in enumerate(QUANTITIES):
        _, band_low, band_high, _ = bands[qi]
        for li, layer in enumerate(layers):
            k = qi * n_layers + li
            rows.append(dict(layer=int(layer), quantity=name, value=value[k], low=low[k], high=high[k], se=se[k], n=s,
                             band_low=band_low[li], band_high=band_high[li]))
    return pd.DataFrame(rows)


def lenses_read(depth: pd.DataFrame) -> list[str]:
    """The lenses a depth table holds, in contract.names.LENSES order."""
    present = set(depth.lens)
    return [name for name in LENSES if name in present]


def lens_kl(depth: pd.DataFrame) -> pd.DataFrame:
    """depth_lens_kl.csv: per lens and layer, KL(final || lens) in nats over the run's depth reads (each probe's
    full-vocabulary distribution at that depth from its own last depth's): mean, median, 90th percentile, n reads.
    Empty for a table without the kl_final column (depth runs before it)."""
    cols = ["lens", "layer", "mean", "median", "p90", "n"]
    if "kl_final" not in depth.columns or depth.kl_final.isna().all():
        return pd.DataFrame(columns=cols)
    g = depth.dropna(subset=["kl_final"]).groupby(["lens", "layer"]).kl_final
    out = pd.DataFrame({"mean": g.mean(), "median": g.median(), "p90": g.quantile(0.9), "n": g.size()}).reset_index()
    out["lens"] = pd.Categorical(out.lens, [x for x in LENSES if x in set(out.lens)], ordered=True)
    return out.sort_values(["lens", "layer"]).astype({"lens": str})[cols].reset_index(drop=True)


def _percentile_bounds(means: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    alpha = (1 - confidence) / 2
    return np.quantile(means, alpha, axis=0), np.quantile(means, 1 - alpha, axis=0)


def departure(excess: np.ndarray, layer_ids, estimates: pd.DataFrame, rng: np.random.Generator,
              n_outer: int = 1000, n_inner: int = 400, confidence: float = 0.95, rule: DepartureRule | None = None,
              readable: np.ndarray | None = None) -> Departure:
    """The departure layer of E ([S, layers] per-scenario excess) from its per-layer CIs in `estimates` under `rule`
    (`readable`: per layer, default all), and its nested bootstrap CI (module docstring)."""
    rule = rule or DepartureRule()
    e = estimates[estimates.quantity == "E"].sort_values("layer")
    bound = departure_bound(estimates, rule)
    point = first_departure(e.low.to_numpy(), e.high.to_numpy(), bound, readable) if len(e) else None
    layer_ids = np.asarray(layer_ids)
    unreadable = () if readable is None else tuple(int(x) for x in layer_ids[~np.asarray(readable, bool)])
    s = excess.shape[0]
    if s < 2:
        return Departure(None if point is None else int(layer_ids[point]), np.nan, np.nan, np.nan, 0, 0, bound, unreadable)
    found = np.full(n_outer, np.nan)
    for b in range(n_outer):
        sample = excess[rng.integers(0, s, s)]
        inner = rng.integers(0, s, (n_inner, s))
        weights = np.zeros((n_inner, s))
        np.add.at(weights, (np.arange(n_inner)[:, None], inner), 1.0)
        lo, hi = _percentile_bounds(weights @ sample / s, confidence)
        k = first_departure(lo, hi, bound, readable)
        if k is not None:
            found[b] = layer_ids[k]
    p_none = float(np.isnan(found).mean())
    alpha = (1 - confidence) / 2
    departed = found[~np.isnan(found)]
    low = float(np.quantile(departed, alpha)) if len(departed) >= 2 else np.nan
    high = float(np.inf) if p_none > alpha else (float(np.quantile(departed, 1 - alpha)) if len(departed) >= 2 else np.nan)
    return Departure(None if point is None else int(layer_ids[point]), low, high, p_none, n_outer, n_inner, bound, unreadable)


def closure_columns(patching: pd.DataFrame, source: str) -> tuple[np.ndarray, list, np.ndarray, np.ndarray]:
    """(layers, scenario ids, closed [S, layers]: p_agent - p_patched, gap [S]: p_agent - p_source of the judge
    patch), each averaged over the patched orders, on the scenarios patched from `source` at every layer."""
    p = patching[patching.cell == DEPTH_CELLS[0]]
    judge = p[p.source == PATCH_SOURCES[0]].drop_duplicates(["scenario_id", "order_index"])
    gap = (judge.p_agent - judge.p_source).groupby(judge.scenario_id).mean()
    rows = p[p.source == source]
    closed = (rows.p_agent - rows.p_violating).groupby([rows.scenario_id, rows.layer]).mean().unstack("layer")
    layers = sorted(closed.columns)
    ids = sorted(set(closed.dropna().index) & set(gap.dropna().index))
    return (np.array(layers, dtype=int), ids, closed.loc[ids, layers].to_numpy(dtype=float) if ids else np.zeros((0, len(layers))),
            gap.loc[ids].to_numpy(dtype=float))


def closure_estimates(patching: pd.DataFrame, rng: np.random.Generator, n_boot: int) -> pd.DataFrame:
    """depth_closure.csv: one row per source x layer: closure (ratio of means), 95% CI, SE, n scenarios, and the
    mean gap p_D - p_J0 it is a share of."""
    rows = []
    for source in PATCH_SOURCES:
        layers, ids, closed, gap = closure_columns(patching, source)
        if not ids:
            continue
        k = len(layers)
        cols = np.column_stack([closed, gap])
        value, low, high, se = scenario_bootstrap(cols, rng, n_boot, combine=lambda sums, k=k: sums[..., :k] / sums[..., k:k + 1])
        for i, layer in enumerate(layers):
            rows.append(dict(source=source, layer=int(layer), closure=value[i], low=low[i], high=high[i], se=se[i],
                             n=len(ids), gap=float(gap.mean())))
    return pd.DataFrame(rows, columns=["source", "layer", "closure", "low", "high", "se", "n", "gap"])
