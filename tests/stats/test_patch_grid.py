"""The patching grid's summary on planted rows: `moved` and `restored` computed by hand, and their intervals
covering the planted value where the scenarios vary around it."""

import numpy as np
import pandas as pd
import pytest

from stats.depth.patch_grid import summarize


def rows(moved, gap, orders=1, pair="pressure"):
    out = []
    for i, (m, g) in enumerate(zip(moved, gap)):
        for k in range(orders):
            out.append(dict(scenario_id=f"s{i}", pair=pair, direction="noising", group="span", layer=3, order=str(k),
                            ld_clean=1.0 + k, ld=1.0 + k + m, ld_source=1.0 + k + g))
    return pd.DataFrame(out)


def test_by_hand():
    got = summarize(rows([0.2, -0.4, 0.5], [1.0, -2.0, 2.0], orders=2), np.random.default_rng(0)).iloc[0]
    assert got.n == 3
    assert got.moved == pytest.approx((0.2 - 0.4 + 0.5) / 3)
    assert got.restored == pytest.approx((0.2 - 0.4 + 0.5) / (1.0 - 2.0 + 2.0))  # a ratio of sums, not a mean of ratios
    assert got.moved_low <= got.moved <= got.moved_high


def test_a_planted_share_is_covered():
    rng = np.random.default_rng(1)
    gap = rng.normal(-1.5, 0.3, 40)
    moved = 0.3 * gap + rng.normal(0, 0.05, 40)  # 30% of each scenario's difference carried across
    got = summarize(rows(moved, gap), np.random.default_rng(2)).iloc[0]
    assert got.restored_low < 0.3 < got.restored_high and got.restored_high - got.restored_low < 0.1
    assert got.moved_high < 0  # the difference moves toward the source's (negative)


def test_the_control_pair_is_summarized_apart():
    rng = np.random.default_rng(3)
    gap = rng.normal(-1.5, 0.3, 40)
    pressure = rows(0.5 * gap, gap)
    control = rows(rng.normal(0, 0.01, 40), rng.normal(0, 0.02, 40), pair="filler_swap")
    got = summarize(pd.concat([pressure, control]), np.random.default_rng(4)).set_index("pair")
    assert got.loc["pressure"].moved == pytest.approx(np.mean(0.5 * gap))
    assert got.loc["pressure"].restored == pytest.approx(0.5)
    c = got.loc["filler_swap"]
    assert c.moved_low < 0 < c.moved_high and c.moved_high - c.moved_low < 0.01  # pooled with the pressure pair it would move -0.37
