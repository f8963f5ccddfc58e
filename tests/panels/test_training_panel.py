"""gap-v2x, the training-only panel: it loads with its review record (every scenario passed a second reader), is
divided over families, writers and versions as gap-v2 is, and shares no id, protagonist or copied wording with gap-v2
(whose held-out part no organism may see) or gap-v1."""

from collections import Counter

import pytest

from panels.lint import closest_wording
from panels.review import REVIEW_REQUIRED
from panels.schema import load_panel

X = load_panel("gap-v2x")  # the review record is checked on load
V2, V1 = load_panel("gap-v2", review=False).records, load_panel("gap-v1", review=False).records


def test_every_scenario_is_reviewed_and_the_families_are_split_evenly():
    assert "gap-v2x" in REVIEW_REQUIRED
    per_brief = Counter((r.generator, r.prompt_version) for r in X.records)
    assert per_brief == {(w, v): 52 for w in ("writer-a", "writer-b") for v in ("1.0.0", "1.1.0")}
    for brief in per_brief:
        fams = Counter(r.family for r in X.records if (r.generator, r.prompt_version) == brief)
        assert fams == {"F1": 12, "F2": 8, "F3": 12, "F4": 8, "F5": 12}, brief
    assert {len(r.options) for r in X.records} == {3, 4}


def test_nothing_is_shared_with_the_evaluated_panels():
    others = V2 + V1
    assert not {r.id for r in X.records} & {r.id for r in others}
    assert not {r.protagonist for r in X.records} & {r.protagonist for r in others}
    assert len({r.protagonist for r in X.records}) == len(X.records)


@pytest.mark.parametrize("other", ["gap-v2", "gap-v1", "gap-v2x"])
def test_no_scenario_is_closer_in_wording_to_another_than_gap_v2s_own_scenarios_are(other):
    """The bar is gap-v2's own: the largest word 5-gram overlap between two of its distinct scenarios."""
    bar = max(closest_wording(V2, V2))[0]
    against = {"gap-v2": V2, "gap-v1": V1, "gap-v2x": X.records}[other]
    worst = max(closest_wording(X.records, against))
    assert worst[0] <= bar, worst
