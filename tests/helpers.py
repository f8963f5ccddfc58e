"""What several test modules share: the repository's paths, the tiny model families, loaded models, the command line
run in process, small runs of each study on tiny models, probe sets and planted tables. Fixtures built on these are
in tests/conftest.py; the served-model test server is in tests/served_helpers.py."""

import dataclasses
import json
import random
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
"""The repository root."""
FIXTURES = ROOT / "tests" / "fixtures"
GOLDENS = ROOT / "tests" / "goldens"

TINY = ["tiny-olmo3", "tiny-qwen2", "tiny-llama3", "tiny-tulu3", "tiny-base"]
CHAT_TINY = ["tiny-olmo3", "tiny-qwen2", "tiny-llama3", "tiny-tulu3"]
SMOLLM2 = pytest.param("smollm2-135m", marks=pytest.mark.smollm)
"""The embedded SmolLM2 as a parametrize value beside the tiny families: its case carries the `smollm` marker."""

_loaded = {}


def get_model(name):
    """Load a model once per test process."""
    from engine.loading import load_model

    if name not in _loaded:
        _loaded[name] = load_model(name, device="cpu")
    return _loaded[name]


def one_batch(fake):
    """A stand-in for engine.generation.generate that returns `fake(model, prompts, **kw)`'s rollouts as one batch:
    like the real one, it hands them to `on_rollouts` (the runner reads each batch there) before returning."""
    def generate(model, prompts, **kw):
        out = fake(model, prompts, **kw)
        if kw.get("on_rollouts") is not None:
            kw["on_rollouts"](list(range(len(prompts))), out)
        return out
    return generate


# The command line, in process.

MSG = [{"role": "user", "content": "Pick one.\nA) Report\nB) Hide\nC) Wait\nReply with only the letter."}]


def cli(argv, capsys):
    """`readout ARGV...` in this process: (exit code, stdout, stderr)."""
    from cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def write_probes(path, rows):
    """A JSONL probes file, one record (a dict, or a line as written) per row."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def readme_example() -> str:
    """The Python API example of docs/own-items-and-api.md (the README links to it)."""
    text = (ROOT / "docs" / "own-items-and-api.md").read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


# Small runs of the studies on tiny models.

def _quick(**changes):
    from readouts.gap import profile as gap_profile

    return dataclasses.replace(gap_profile.PROFILES["quick"], **changes)


TEST_PROFILE = _quick(name="test", max_units=5, orders={"D": 3, "J0": 3, "control": 3, "raw": 2}, j_samples=2, j_budget=6,
                      dose_budget=6, dose_brief_budget=3, dose_samples=1, chunk_size=2)
"""The gap study's profile `test` (registered by register_test_profiles), and `sampling`: more orders per scenario."""

TINY_PROFILE = _quick(name="show-test", max_units=2, orders={"D": 2, "J0": 1, "control": 1, "raw": 1}, j_samples=1,
                      j_budget=5, dose_budget=4, dose_brief_budget=3, dose_samples=1, chunk_size=2)
"""The profile of make_gap_run: two scenarios, few orders and short budgets."""

DEPTH_PROFILE = _quick(name="depth-test", max_units=4, orders={"D": 2, "J0": 2, "control": 1, "raw": 1}, chunk_size=4,
                       patch_orders=2, grid_stride=1)
"""A depth run's profile: four scenarios, two orders of D and J0."""

FRAME_OF = {"D": "agent", "J0": "judge_letter"}


def register_test_profiles(monkeypatch):
    """Registers the gap profiles `test` and `sampling` for the test (gap_run's default profile is `test`)."""
    from readouts.gap import profile as gap_profile

    monkeypatch.setitem(gap_profile.PROFILES, "test", TEST_PROFILE)
    monkeypatch.setitem(gap_profile.PROFILES, "sampling", dataclasses.replace(
        TEST_PROFILE, name="sampling", max_units=10, orders={**TEST_PROFILE.orders, "D": 60}, chunk_size=10))


def gap_run(tmp_path, name="run", model="tiny-qwen2", readouts=None, sample=False, **kw):
    """`readout run` through the driver, as the CLI calls it (profile `test`: register_test_profiles)."""
    from readouts.driver import ModelOptions, RunOptions
    from readouts.driver import run as run_study
    from readouts.gap.study import GapStudy

    logs = []
    options = RunOptions(model=ModelOptions(model), **{"profile": "test", "out": str(tmp_path / name), "progress": False, **kw})
    path = run_study(GapStudy(readouts=readouts, sample=sample), options, log=logs.append)
    return path, logs


def make_gap_run(path, readouts="D,J", sample=False):
    """A two-scenario judgment-action run on tiny-qwen2 (seconds)."""
    from readouts.driver import ModelOptions, RunOptions
    from readouts.driver import run as run_study
    from readouts.gap import profile as gap_profile
    from readouts.gap.study import GapStudy

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(gap_profile.PROFILES, TINY_PROFILE.name, TINY_PROFILE)
        options = RunOptions(model=ModelOptions("tiny-qwen2"), profile=TINY_PROFILE.name, out=str(path), progress=False)
        return run_study(GapStudy(readouts=readouts, sample=sample), options, log=lambda _: None)


def make_nsi_run(path):
    """An NSI run on tiny-llama3 with one sampled reply and a short budget."""
    from readouts.driver import ModelOptions, RunOptions
    from readouts.driver import run as run_study
    from readouts.nsi import profile as nsi_profile
    from readouts.nsi.profile import NsiProfile
    from readouts.nsi.study import NsiStudy

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(nsi_profile.PROFILES, "quick", NsiProfile(name="quick", chunk_size=7, samples=1, budget=8))
        options = RunOptions(model=ModelOptions("tiny-llama3"), overrides=("samples=1",), out=str(path), progress=False)
        return run_study(NsiStudy(), options, log=lambda _: None)


def make_adapter(folder):
    """A LoRA adapter on tiny-llama3 (q, v and down projections, weights scaled up so the outputs move visibly),
    saved to `folder`: (folder, the unmerged PEFT model)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from engine.loading import load_model

    base = load_model("tiny-llama3", device="cpu")
    torch.manual_seed(0)  # test-only adapter weights; the library never seeds globally
    peft_model = get_peft_model(base.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                       init_lora_weights=False))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.mul_(3.0)  # an adapter that moves the outputs visibly
    peft_model.save_pretrained(folder)
    return folder, peft_model


def tiny_recipe(name="gap", base="tiny-qwen2", **kw):
    """A shipped organism's recipe scaled to a tiny model: its last layer, two units, a few steps; keywords override."""
    from engine.loading import load_model
    from organisms.recipes import organism

    last = load_model(base, device="cpu").model.config.num_hidden_layers - 1
    fields = dict(base=base, band=(last, last), units=2, steps=4, batch=4, rank=4, alpha=8.0, lr=1e-2,
                  targets_modules=("q_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    return dataclasses.replace(organism(name), **{**fields, **kw})


# Depth references: a plain forward's hidden states.

def order_perm(scenario, order_ids):
    """The option permutation of an `order` column value ("b,a,c")."""
    index = {o.id: i for i, o in enumerate(scenario.options)}
    return tuple(index[o] for o in order_ids.split(","))


def depth_prompt(lm, scenario, frame, cell, order_ids, perm=None):
    """A depth run's prompt ids for one scenario, frame, cell and option order, and its rendering."""
    from engine.render import encode_prompt
    from panels.frames import render
    from readouts.gap.recipe import prompt_of

    perm = order_perm(scenario, order_ids) if perm is None else perm
    r = render(scenario, frame, cell, perm, DEPTH_PROFILE.frames)
    return encode_prompt(lm.tokenizer, prompt_of(r)), r


def letter_mass_of(lm, logits, letters):
    """Each letter's probability (summed over its token forms) under `logits`."""
    probs = logits.float().softmax(-1)
    return [float(sum(probs[t] for t in ids)) for ids in lm.letters(tuple(letters)).token_ids]


def forward_states(model, ids):
    """A plain forward over `ids` with every hidden state."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True, use_cache=False)
    return out


# Engine inputs.

OPTIONS = [
    "Report the failed test to the client today",
    "Mark the build as passing in the release notes",
    "Ask for one more day to rerun the suite",
    "Escalate to the quality lead",
    "Re-run only the tests that passed",
]
WORDS = "the agent must decide whether to file report on time or not while the client waits for news".split()


def probe_set(name, n_scenarios=3, orders=6, seed=0):
    """Scenarios x option orders: shared prefixes, suffixes of different lengths, 3 to 5 options."""
    from engine.render import Prompt, encode_prompt

    rng = random.Random(seed)
    lm = get_model(name)
    seqs, letters = [], []
    for s in range(n_scenarios):
        context = f"Case {s}. " + " ".join(rng.choice(WORDS) for _ in range(12 + 17 * s))
        for o in range(orders):
            k = 3 + (o + s) % 3
            opts = rng.sample(OPTIONS, k)
            lines = "\n".join(f"{'ABCDE'[i]}) {t}" for i, t in enumerate(opts))
            body = f"{context}\n{lines}\nReply with only the letter."
            prompt = Prompt(text=body + "\nAnswer:") if name == "tiny-base" else Prompt(messages=({"role": "user", "content": body},))
            seqs.append(encode_prompt(lm.tokenizer, prompt))
            letters.append(lm.letters(tuple("ABCDE"[:k])))
    # A lone prompt with no shared prefix, and an exact duplicate of another prompt.
    seqs.append(seqs[0][: max(5, len(seqs[0]) // 3)])
    letters.append(letters[0])
    seqs.append(list(seqs[1]))
    letters.append(letters[1])
    return lm, seqs, letters


def max_diff(a, b):
    """The largest difference between two lists of reads' masses and tempered masses."""
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.mass + ra.tempered, rb.mass + rb.tempered))


QUESTIONS = [
    "Which is right, A or B? Explain, then end with Answer: <letter>.",
    "Say hello.",
    "Count to five, then explain why the sky is blue in some detail, please.",
    "Pick one: A) stay B) go C) wait",
    "Which is right, A or B? Explain briefly.",
    "A delivery is late and the customer is waiting. What do you tell them, and why?",
    "List three colours.",
    "Pick one: A) stay B) go",
]
"""Generation prompts of different lengths, some with options."""

PATHS = ["flash", "explicit", "static", "dense"]
"""The decode paths (use_path)."""


def prompts_for(lm, k=len(QUESTIONS)):
    """The first k QUESTIONS as the model reads them (chat template, or raw text for a base model)."""
    from engine.render import Prompt, encode_prompt, encode_raw

    if lm.tokenizer.chat_template:
        return [encode_prompt(lm.tokenizer, Prompt(messages=({"role": "user", "content": q},))) for q in QUESTIONS[:k]]
    return [encode_raw(lm.tokenizer, q) for q in QUESTIONS[:k]]


def use_path(monkeypatch, path):
    """Route generation through one decode path."""
    import engine.decode as decode
    import engine.generation as generation

    if path == "explicit":
        monkeypatch.setattr(decode, "USE_FLASH_CPU", False)
    if path == "dense":
        monkeypatch.setattr(generation, "supports_cascade", lambda model: False)
    return dict(static_shapes=path == "static")


# Planted tables for the stats layer.

LAYERS = 8
"""planted_depth's decoder layers."""


def planted_depth(n=40, start=5, effect=0.3, noise=0.02, seed=0, orders=2, drop_twin=()):
    """D/J0 x primary/twin x orders x layers; the agent's primary violating mass rises by `effect` from layer
    `start` on (E planted there), the judge and the twins stay put."""
    from contract.tables import DEPTH

    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n):
        base = rng.uniform(0.1, 0.3)
        for cell in ("primary", "twin"):
            if cell == "twin" and s in drop_twin:
                continue
            for readout, frame in (("D", "agent"), ("J0", "judge_letter")):
                for k in range(orders):
                    for layer in range(LAYERS + 1):
                        p = base + (effect if (readout == "D" and cell == "primary" and layer >= start) else 0.0)
                        p = float(np.clip(p + rng.normal(0, noise), 0, 1))
                        rows.append(dict(model="m", scenario_id=f"s{s:02d}", family="F1", cell=cell, order_index=k,
                                         order="a,b", letters="AB", violating_letter="A", readout=readout, frame=frame,
                                         layer=layer, n_layers=LAYERS, lens="logit", mass=[p, 1 - p], letter_mass=1.0,
                                         p_violating=p, kl_final=float("nan")))
    return DEPTH.frame(rows)


def hand_excess(df):
    """E per layer by loops: per scenario and cell, the order mean of D minus that of J0; primary minus twin;
    the mean over scenarios having both cells."""
    out = {}
    for layer in range(LAYERS + 1):
        d = df[df.layer == layer]
        per = {}
        for (sid, cell, readout), g in d.groupby(["scenario_id", "cell", "readout"]):
            per[(sid, cell, readout)] = g.p_violating.mean()
        ids = {sid for sid, cell, _ in per if cell == "twin"}
        out[layer] = np.mean([(per[(s, "primary", "D")] - per[(s, "primary", "J0")])
                              - (per[(s, "twin", "D")] - per[(s, "twin", "J0")]) for s in sorted(ids)])
    return out


# The stats layer's hand-built 8-scenario gap run.

# Options a, b, c; b is the violating one. Per scenario: family; primary D (violating fraction,
# majority prob, p_violating, letter mass); J frames (options, judge_1 stability, p per frame);
# twin the same; control and J0 p_violating; dose arms (reasoning, filler) on the primary.
A4 = ("a", "a", "a", "a")
FIXTURE = {
    #      fam   f     maj  pD    massD opts                  st1    pJ frames                 | twin: f  maj  pD    opts  pJ frames      | ctl  j0   | reason filler  # noqa: E501
    "s1": ("F1", 0.50, 0.6, 0.50, 0.9, A4,                   True, (0.2, 0.2, 0.2, 0.2),      0.40, 0.3, 0.40, A4, (0.2,) * 4,          0.70, 0.20, 0.3, 0.5),  # noqa: E501
    "s2": ("F1", 0.30, 0.2, 0.40, 0.9, ("a", "a", "a", "c"), True, (0.1, 0.1, 0.05, 0.15),    0.10, 0.1, 0.35, A4, (0.1,) * 4,          0.50, 0.10, 0.2, 0.4),  # noqa: E501
    "s3": ("F1", 0.60, 0.7, 0.60, 0.9, ("a", "b", "b", "a"), True, (0.4, 0.5, 0.3, 0.4),      0.60, 0.7, 0.60, A4, (0.3,) * 4,          0.90, 0.30, 0.5, 0.5),  # noqa: E501
    "s4": ("F1", 0.05, 0.0, 0.05, 0.9, A4,                   True, (0.1,) * 4,                0.05, 0.0, 0.05, A4, (0.1,) * 4,          0.40, 0.10, None, None),  # noqa: E501
    "s5": ("F1", 0.50, 0.5, 0.50, 0.9, A4,                   False, (0.2,) * 4,               0.50, 0.5, 0.50, A4, (0.2,) * 4,          0.70, 0.20, None, None),  # noqa: E501
    "s6": ("F1", 0.50, 0.5, 0.50, 0.9, ("b",) * 4,           True, (0.7,) * 4,                0.50, 0.5, 0.40, ("b",) * 4, (0.7,) * 4,  1.00, 0.60, None, None),  # noqa: E501
    "s7": ("F2", 0.50, 0.5, 0.50, 0.9, A4,                   True, (0.2,) * 4,                0.40, 0.3, 0.40, A4, (0.2,) * 4,          0.70, 0.20, None, None),  # noqa: E501
    "s8": ("F3", 0.50, 0.5, 0.50, 0.2, A4,                   True, (0.2,) * 4,                0.40, 0.3, 0.40, A4, (0.2,) * 4,          0.65, 0.20, None, None),  # noqa: E501
}


def scenario_row(sid, fam, cell, readout, frame, p, f=None, maj=None, mass=0.9, **kw):
    """One scenarios.parquet row of the hand-built run; keywords set its other columns."""
    r = dict(model="fixture-model", panel="fixture", scenario_id=sid, family=fam, domain="d", generator="g1",
             prompt_version="1.0.0", cell=cell, readout=readout, frame=frame, budget=None, p_violating=p,
             violating_fraction=p if f is None else f, majority_violating_prob=0.0 if maj is None else maj,
             letter_mass=mass, judged_option=None, stability=None, violating_judged_frames=None, n_orders=32,
             n_rollouts=32, completed_fraction=None)
    r.update(kw)
    return r


def fixture_rows(violating_column=True):
    """scenarios.parquet of the hand-built 8-scenario run (FIXTURE)."""
    rows = []
    for sid, (fam, f, maj, pd_, massd, opts, st1, pjs, tf, tmaj, tpd, topts, tpjs, ctl, j0, rea, fil) in FIXTURE.items():
        for cell, (ff, mm, pdv, oo, pp, s1) in (("primary", (f, maj, pd_, opts, pjs, st1)),
                                                ("twin", (tf, tmaj, tpd, topts, tpjs, True))):
            rows.append(scenario_row(sid, fam, cell, "D", "agent", pdv, ff, mm, massd if cell == "primary" else 0.9))
            for k, (o, pj) in enumerate(zip(oo, pp)):
                rows.append(scenario_row(sid, fam, cell, "J", f"judge_{k + 1}", pj, judged_option=o,
                                         stability=s1 if k == 0 else True, budget=512, n_rollouts=9))
            rows.append(scenario_row(sid, fam, cell, "J", "judge", float(np.mean(pp)), budget=512, n_rollouts=36,
                                     judged_option=oo[0], stability=s1,
                                     violating_judged_frames=sum(o == "b" for o in oo)))
        rows.append(scenario_row(sid, fam, "primary", "control", "control", ctl))
        rows.append(scenario_row(sid, fam, "primary", "J0", "judge_letter", j0))
        if rea is not None:
            rows.append(scenario_row(sid, fam, "primary", "dose_reasoning", "reasoning", rea, budget=512, completed_fraction=0.1))
            rows.append(scenario_row(sid, fam, "primary", "dose_filler", "filler", fil, budget=512, completed_fraction=1.0))
    df = pd.DataFrame(rows)
    if violating_column:
        df["violating"] = "b"
    df["budget"] = df["budget"].astype("Int64")
    df["violating_judged_frames"] = df["violating_judged_frames"].astype("Int64")
    df["stability"] = df["stability"].astype("boolean")
    return df


# Per screened scenario with dose rows: the rider's option per rollout at its end and at the dose budget, and
# the anchor rules of the cut reads (s3's rollout 3 names a tool in place of the letter).
RIDER = {
    "s1": (("a", "a", "b", "c"), ("a", "a", "b", "c")),  # 4 of 4 agree
    "s2": (("a", "b", "a", "b"), ("a", "a", "b", "b")),  # 2 of 4
    "s3": (("b", "b", "a", "c"), ("a", "b", "b", "b")),  # 1 of 4 (rollout 3: the tool named stands for c)
}
TOOL = ("s3", 3, "c")


def _dose_probe(sid, readout, rollout, option, rule="forced_at_budget"):
    letter = "ABC"["abc".index(option)]
    return dict(scenario_id=sid, cell="primary", readout=readout, frame="dose_reasoning", rollout=rollout, order="a,b,c", letters="ABC",
                top_letter=letter, anchor_rule=rule)


def write_dose_run(d):
    """The 8-scenario run of fixture_rows with the rider's rows and probes (RIDER, TOOL) in folder `d`."""
    d.mkdir()
    rows = fixture_rows()
    extra, probes = [], []
    for sid, (full, cut) in RIDER.items():
        extra.append(scenario_row(sid, "F1", "primary", "dose_rider", "dose_reasoning", 0.3, budget=2048, completed_fraction=0.75))
        extra.append(scenario_row(sid, "F1", "primary", "dose_rider_cut", "dose_reasoning", 0.3, budget=512,
                                  completed_fraction=0.25))
        for j, (x, y) in enumerate(zip(full, cut)):
            probes.append(_dose_probe(sid, "dose_rider", j, x, "own"))
            if (sid, j) == TOOL[:2]:  # the model named the tool for c; the top letter is A
                probes.append({**_dose_probe(sid, "dose_rider_cut", j, "a"), "anchor_rule": f"own+tool:{TOOL[2].upper()}"})
            else:
                probes.append(_dose_probe(sid, "dose_rider_cut", j, y))
    extra = pd.DataFrame(extra).assign(violating="b")
    df = pd.concat([rows, extra], ignore_index=True)
    df["budget"] = df["budget"].astype("Int64")
    df.to_parquet(d / "scenarios.parquet", index=False)
    pd.DataFrame(probes).to_parquet(d / "probes.parquet", index=False)
    (d / "manifest.json").write_text(json.dumps({"model": {"name": "fixture-model"}, "panel": {"name": "fixture"}}))
    return d
