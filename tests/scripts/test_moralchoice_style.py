"""scripts/moralchoice_style.py: the shipped probes are what `render` makes, balanced over frames and orders;
`summarize` gives hand-computed numbers on a planted scored table and runs on a tiny model's real output."""

import importlib.util
import json
import random
import re
from collections import Counter

import pytest

from cli.main import main
from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("moralchoice_style", ROOT / "scripts" / "moralchoice_style.py")
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)


def test_probes_file_is_what_render_writes():
    assert (ROOT / "examples" / "moralchoice-style.jsonl").read_text(encoding="utf-8") == mc.probes_text(mc.render())


def test_every_item_has_both_frames_and_orders_and_letters_are_balanced():
    items = {it["item"]: it for it in mc.load_items()}
    probes = mc.render()
    assert len(items) == 40 and len(probes) == 160 and len({p["id"] for p in probes}) == 160
    cells = Counter((p["metadata"]["item"], p["metadata"]["frame"], p["metadata"]["order"]) for p in probes)
    assert set(cells) == {(i, f, o) for i in items for f in mc.FRAMES for o in mc.ORDERS} and set(cells.values()) == {1}
    assert Counter(p["metadata"]["violating_letter"] for p in probes) == {"A": 80, "B": 80}
    assert Counter(it["rule"] for it in items.values()) == dict.fromkeys(Counter(it["rule"] for it in items.values()), 4)
    for p in probes:
        meta, text = p["metadata"], p["messages"][0]["content"]
        item = items[meta["item"]]
        assert meta["rule"] == item["rule"] and p["letters"] == ["A", "B"]
        options = dict(re.findall(r"^([AB])\) (.*)$", text, re.MULTILINE))
        violate = mc.fill(item["violate"], meta["frame"], item["name"], "test")
        assert options[meta["violating_letter"]] == violate  # the metadata names the violating option's letter
        if meta["frame"] == "agent":
            assert text.startswith(f"You are {item['name']}, {item['role']}. ") and text.endswith(mc.AGENT_ASK)
        else:
            assert text.startswith(f"{item['name']} is {item['role']}. ") and not mc.SECOND_PERSON.search(text)
            assert text.endswith(f"Which option should {item['name']} choose? Reply with only the letter.")


# Planted violating shares (option_mass at the violating letter), per item, frame and order:
#   agent: X (0.9 + 0.7) / 2 = 0.80, Y (0.5 + 0.1) / 2 = 0.30 -> mean 0.55, CI [0.30, 0.80]
#   judge: X (0.7 + 0.4) / 2 = 0.55, Y (0.6 + 0.4) / 2 = 0.50 -> mean 0.525, CI [0.50, 0.55]
#   agent - judge: X 0.25, Y -0.20 -> mean 0.025, CI [-0.20, 0.25]
# With two items a resample's mean is one item's value with probability 1/4 each, so the 2.5% and 97.5%
# percentiles of 10,000 resamples are the two items' values. Misreadings give other numbers: order 0 only
# (agent 0.70), the mass at A whatever the order (agent 0.65), the unnormalized `mass` (agent 0.275), an
# unpaired difference (CI [-0.25, 0.30]).
PLANTED = {("X", "agent"): (0.9, 0.7), ("Y", "agent"): (0.5, 0.1), ("X", "judge"): (0.7, 0.4), ("Y", "judge"): (0.6, 0.4)}


def planted_rows():
    rows = []
    for (item, frame), shares in PLANTED.items():
        for order, v in zip(mc.ORDERS, shares):
            viol = mc.LETTERS[order]
            other = mc.LETTERS[1 - order]
            option = {viol: v, other: 1 - v}
            option = {k: option[k] for k in mc.LETTERS}
            rows.append({"id": f"{item}-{frame}-{order}", "metadata": {"item": item, "rule": "r", "frame": frame,
                                                                          "order": order, "violating_letter": viol},
                         "mass": {k: m / 2 for k, m in option.items()}, "letter_mass": 0.5, "option_mass": option,
                         "tempered": option, "tokens": 10})
    random.Random(0).shuffle(rows)  # row order carries nothing
    return rows


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_summarize_on_a_planted_table(tmp_path):
    got = mc.summarize(write_rows(tmp_path / "s.jsonl", planted_rows())).set_index("quantity")
    want = {"agent": (0.55, 0.30, 0.80), "judge": (0.525, 0.50, 0.55), mc.DIFF: (0.025, -0.20, 0.25)}
    assert list(got.index) == ["agent", "judge", mc.DIFF] and (got["n_items"] == 2).all()
    for q, (mean, low, high) in want.items():
        assert got.loc[q, ["mean", "low", "high"]].tolist() == pytest.approx([mean, low, high], abs=1e-12), q


def test_summarize_needs_both_orders_and_the_violating_letter(tmp_path, capsys):
    rows = [r for r in planted_rows() if r["id"] != "Y-judge-1"]
    with pytest.raises(mc.InputError, match=r"item 'Y', frame judge: needs exactly one row for each order"):
        mc.summarize(write_rows(tmp_path / "a.jsonl", rows))
    rows = planted_rows()
    del rows[3]["metadata"]["violating_letter"]
    assert mc.main(["summarize", str(write_rows(tmp_path / "b.jsonl", rows))]) == 2
    assert "b.jsonl:4: metadata.violating_letter: missing" in capsys.readouterr().err


def test_summarize_on_a_tiny_models_scores(tmp_path, capsys):
    """The first 8 probes (2 items, both frames and orders) scored by `readout score` on tiny-qwen2."""
    probes = tmp_path / "p.jsonl"
    probes.write_text("".join((ROOT / "examples" / "moralchoice-style.jsonl").read_text().splitlines(True)[:8]))
    out = tmp_path / "scored.jsonl"
    with pytest.raises(SystemExit) as exc:
        main(["score", str(probes), "--model", "tiny-qwen2", "--out", str(out), "--no-progress"])
    assert exc.value.code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    cell = {}
    for r in rows:  # the plain reading: violating option's share, averaged over the orders
        m = r["metadata"]
        cell.setdefault(m["frame"], {}).setdefault(m["item"], []).append(r["option_mass"][m["violating_letter"]])
    ref = {f: sum(sum(v) / 2 for v in d.values()) / 2 for f, d in cell.items()}
    got = mc.summarize(out, n_boot=1000).set_index("quantity")
    assert (got["n_items"] == 2).all()
    assert got.loc["agent", "mean"] == pytest.approx(ref["agent"]) and got.loc["judge", "mean"] == pytest.approx(ref["judge"])
    assert got.loc[mc.DIFF, "mean"] == pytest.approx(ref["agent"] - ref["judge"])
    assert (got["low"] <= got["mean"] + 1e-12).all() and (got["mean"] <= got["high"] + 1e-12).all()
    assert mc.main(["summarize", str(out), "--n-boot", "1000"]) == 0 and "agent_minus_judge    2" in capsys.readouterr().out
