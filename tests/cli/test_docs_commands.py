"""A new user's path: every command block of README.md and docs/*.md runs as a test.

Each line of a ```bash block is one command (`\\` continuations joined, comments dropped). The commands run in
page order (README first) from a scratch folder laid out like a clone (examples/ and scripts/ linked in), each
once, as the pages write them except for the substitutions of its entry in RUN: the embedded SmolLM2 becomes
the tiny tiny-qwen2 and the sizes shrink (`--limit 1`, short budgets, few bootstrap resamples), placeholders
(RUN_DIR, DIR, ...) name the folders earlier commands wrote, `[optional parts]` are left out, and programs of
the venv (`.venv/bin/readout`, `.venv/bin/python`) are this test's interpreter (`readout` in process). Each
substitution must occur in its command, and each command must exit 0 and write what its entry expects.
A command that cannot run here is in NOT_RUN with the reason. A command in the pages that is in neither table
fails test_every_command_is_run_or_listed, and so does an entry the pages no longer hold.

The other blocks: the ```python block of docs/own-items-and-api.md runs in tests/readouts/test_api.py (checked
here to be the only one); a ```toml block is a user models file, read here by `readout models --models`;
```text blocks are sample output and citations. Every `readout` line, run or not, also parses against its
command line (test_every_documented_command_parses).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from cli.main import cli, main
from tests.helpers import ROOT, readme_example

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("bash", "python", "toml", "text")
"""Every fenced block names one of these: commands, the Python example, a models file, sample output."""


def blocks() -> list[tuple[str, str, str]]:
    """(page, language, text) of every fenced block, indented ones (in a list item) included."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^( *)```(\S*)\n(.*?)^\1```\s*$", text, re.S | re.M):
            body = "\n".join(line[len(m.group(1)):] for line in m.group(3).splitlines())
            out.append((page.name, m.group(2), body))
    return out


def shell_lines(body: str) -> list[str]:
    """The commands of a bash block: continuations joined, comments and blank lines dropped, spaces collapsed."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
        if line:
            out.append(line)
    return out


def doc_commands() -> list[tuple[str, str]]:
    """(page, command) of every bash block of the pages, in page order, each command once (its first page)."""
    seen, out = set(), []
    for page, language, body in blocks():
        if language == "bash":
            for line in shell_lines(body):
                if line not in seen:
                    seen.add(line)
                    out.append((page, line))
    return out


@dataclass(frozen=True)
class Run:
    """How a documented command runs here."""

    why: str
    """What is changed, and why."""
    subs: tuple[tuple[str, str], ...] = ()
    """(as written, as run), applied in order after the global TINY substitution; each must occur."""
    add: str = ""
    """Options appended: the reduced sizes."""
    needs: tuple[str, ...] = ()
    """Documented commands whose output this one reads (run first, once)."""
    setup: str | None = None
    """A name in SETUP: input files this command reads that no documented command writes."""
    expect: tuple[str, ...] = ()
    """Paths (in the scratch folder) the command must have written."""


TINY = ("smollm2-135m", "tiny-qwen2")
"""Applied to every command run: the embedded SmolLM2 (a 135M model: minutes per study on two cores) becomes a tiny
model of the real Qwen2 architecture built offline (engine/tiny.py); run folders follow the model's name."""
GAP = "runs/tiny-qwen2/gap-v2/quick-seed0"
NSI = "runs/tiny-qwen2/nsi-14/nsi-quick-seed42"
SMALL = "--limit 1 --readouts D,J --set j_budget=6 --set j_samples=1 --set orders.D=2 --no-progress"
"""A gap run reduced to one scenario, the action and the reasoned judgment, short rollouts."""
SMALL_NSI = "--limit 1 --samples 1 --set budget=8 --no-progress"
SWEEP_SMALL = SMALL.replace("--set orders.D=2 ", "") + " --n-boot 20 --mass-floor 0"
BOOT = "--n-boot 20"
GAP_RUN = (".venv/bin/readout run --model smollm2-135m --panel gap-v2 --profile quick [--readouts D,J,J0,raw,control,dose] "
           "[--seed 0] [--sample] [--out DIR]")
GAP_STATS = ".venv/bin/readout stats runs/smollm2-135m/gap-v2/quick-seed0"
NSI_RUN = ".venv/bin/readout nsi --model smollm2-135m --profile quick"
SWEEP = ".venv/bin/readout sweep -m ckpts/step-1000 -m ckpts/step-2000 -m ckpts/step-3000 --lineage mine --out sweeps/mine --set orders.D=8 --seed 1"
COMPARE = ".venv/bin/readout compare runs/olmo-3-7b-sft/... runs/olmo-3-7b-dpo/... runs/olmo-3-7b/... --out runs/compare"
DEPTH_RUN = "readout run --model smollm2-135m --profile quick --readouts D,J0,depth --out runs/depth-demo"
LENS_TRAIN = "readout lens train --model smollm2-135m --out runs/lens-smollm2.safetensors"
LENS_RUN = ("readout run --model smollm2-135m --profile quick --readouts D,J0,depth --lens runs/lens-smollm2.safetensors "
            "--out runs/depth-tuned")
EXPORT = ".venv/bin/readout nsi-export RUN_DIR [RUN_DIR...] --out DIR --n 198 --stratify framing,model --allocation paper"
SYNTHETIC = "synthetic-nsi"
"""A synthetic NSI run (stats/nsi/synth.py): a tiny model's replies are not JSON, so a tiny run has no parsed reply
to export for coding; the synthetic run's replies parse, like a real model's."""
SLURM = "a fake sbatch (SBATCH) that records the submission: there is no SLURM cluster here"

RUN = {
    "make readout": Run(
        "the Makefile's plain recipe, its variables at their defaults (MODEL, PANEL, PROFILE), at the reduced size",
        add=SMALL, expect=(f"{GAP}/probes.parquet",)),
    GAP_STATS: Run("fewer bootstrap resamples", add=BOOT, needs=("make readout",), expect=(f"{GAP}/stats/report.md",)),
    ".venv/bin/readout report runs/smollm2-135m/gap-v2/quick-seed0": Run(
        "as written", needs=(GAP_STATS,), expect=(f"{GAP}/report.html",)),
    ".venv/bin/readout organism list": Run("as written"),
    ".venv/bin/readout models": Run("as written"),
    ".venv/bin/readout panels list": Run("as written"),
    ".venv/bin/readout panels validate gap-v2": Run("as written"),
    SWEEP: Run("the three checkpoints are copies of tiny-llama3 (ckpts/), each read at the reduced size; fewer resamples",
               add=SWEEP_SMALL, setup="checkpoints", expect=("sweeps/mine/compare", "sweeps/mine/sweep.toml")),
    ".venv/bin/readout sweep --list checkpoints.txt --stage ckpts/warm=mine:warmup --out sweeps/mine": Run(
        "checkpoints.txt lists one more copy of tiny-llama3 (ckpts/warm), added to the sweep above at its settings",
        add=SWEEP_SMALL + " --set orders.D=8 --seed 1", needs=(SWEEP,), setup="checkpoint-list",
        expect=("sweeps/mine/runs/warm/manifest.json",)),
    DEPTH_RUN: Run(
        "one scenario, two orders", add="--limit 1 --set orders.D=2 --set orders.J0=1 --no-progress",
        expect=("runs/depth-demo/depth.parquet",)),
    "readout stats runs/depth-demo": Run(
        "fewer resamples", add=BOOT,
        needs=(DEPTH_RUN,),
        expect=("runs/depth-demo/stats",)),
    LENS_TRAIN: Run("two steps on two scenarios, one held out", add="--steps 2 --scenarios 2 --held-out 1 --no-progress",
                    expect=("runs/lens-smollm2.safetensors",)),
    LENS_RUN: Run("one scenario, two orders", add="--limit 1 --set orders.D=2 --set orders.J0=1 --no-progress",
                  needs=(LENS_TRAIN,), expect=("runs/depth-tuned/depth.parquet",)),
    "readout stats runs/depth-tuned": Run("fewer resamples", add=BOOT, needs=(LENS_RUN,),
                                          expect=("runs/depth-tuned/stats/depth_lens_kl.csv",)),
    GAP_RUN: Run("the optional parts left out: the same run as `make readout`, given again, resumes a finished run",
                 add=SMALL, needs=("make readout",), expect=(f"{GAP}/probes.parquet",)),
    ".venv/bin/readout run --model smollm2-135m --set orders.D=8 --set j_budget=64 --limit 5 --out runs/my-settings": Run(
        "one scenario, a shorter budget, the action and the reasoned judgment (without --out it would find the quick "
        "run's folder, which holds other settings, and stop)",
        subs=(("j_budget=64", "j_budget=6"), ("--limit 5", "--limit 1")),
        add="--readouts D,J --set j_samples=1 --no-progress", expect=("runs/my-settings/probes.parquet",)),
    COMPARE: Run("the three checkpoints are the sweep's runs", subs=(
        ("runs/olmo-3-7b-sft/...", "sweeps/mine/runs/step-1000"), ("runs/olmo-3-7b-dpo/...", "sweeps/mine/runs/step-2000"),
        ("runs/olmo-3-7b/...", "sweeps/mine/runs/step-3000")), add=BOOT, needs=(SWEEP,), expect=("runs/compare",)),
    ".venv/bin/readout show runs/smollm2-135m/gap-v2/quick-seed0 gap2-a1-f1-01": Run("as written", needs=("make readout",)),
    ".venv/bin/readout show runs/smollm2-135m/gap-v2/quick-seed0 gap2-a1-f1-01 --cell twin --readout J": Run(
        "as written", needs=("make readout",)),
    ".venv/bin/readout report RUN_A RUN_B runs/compare -o report.html": Run(
        "RUN_A the quick gap run, RUN_B the quick NSI run: a combined page", subs=(("RUN_A", GAP), ("RUN_B", NSI)),
        needs=(GAP_STATS, ".venv/bin/readout nsi-stats RUN_DIR [RUN_DIR...] --out DIR [--groups groups.json] "
               "[--null dilemma-rates|common-rate|per-dilemma] [--params params.json]", COMPARE), expect=("report.html",)),
    "scripts/slurm_submit.sh olmo-3-7b gap-v2 paper runs/olmo/paper 16": Run(SLURM, expect=("logs",)),
    "STUDY=nsi scripts/slurm_submit.sh olmo-3-7b nsi-14 paper runs/olmo/nsi-paper 7": Run(SLURM),
    "scripts/slurm_submit.sh olmo-3-7b gap-v2 paper runs/olmo/paper 16 --only 5": Run(SLURM),
    'SBATCH_ARGS="--partition=gpu --account=lab" scripts/slurm_submit.sh ...': Run(
        SLURM + "; `...` the arguments of the first submission", subs=(("...", "olmo-3-7b gap-v2 paper runs/olmo/paper 16"),)),
    ".venv/bin/readout run --plan --model smollm2-135m --panel gap-v1 --profile paper --gpu h200": Run(
        "as written (the plan loads no weights): the tiny model's plan"),
    ".venv/bin/readout nsi --model openai:allenai/Olmo-3-7B-Instruct@http://gpu-node:8000/v1 --profile paper --plan": Run(
        "as written: a served model's plan counts requests and sends nothing (the host need not exist)"),
    "readout nsi --model openai:gpt-4.1-mini@https://api.openai.com/v1 --profile paper --plan": Run(
        "as written: a served model's plan counts requests and sends nothing"),
    NSI_RUN: Run("one dilemma, one sampled reply, an 8-token budget", add=SMALL_NSI, expect=(f"{NSI}/nsi_replies.parquet",)),
    ".venv/bin/readout nsi --model olmo-3-7b --profile paper --shard 0/4": Run(
        "tiny-qwen2 for the 7B model, two dilemmas, one sampled reply, an 8-token budget (the paper's 4096 on a tiny "
        "model is minutes); shard 0 of 4 into a folder of its own",
        subs=(("olmo-3-7b", "tiny-qwen2"),), add="--limit 2 --samples 1 --set budget=8 --out runs/nsi-shard --no-progress",
        expect=("runs/nsi-shard",)),
    ".venv/bin/readout nsi-stats RUN_DIR [RUN_DIR...] --out DIR [--groups groups.json] "
    "[--null dilemma-rates|common-rate|per-dilemma] [--params params.json]": Run(
        "RUN_DIR the quick NSI run; the optional parts left out", subs=(("RUN_DIR", NSI), ("--out DIR", f"--out {NSI}/stats")),
        needs=(NSI_RUN,), expect=(f"{NSI}/stats",)),
    EXPORT: Run("RUN_DIR a synthetic NSI run (see SYNTHETIC); the optional parts left out",
                subs=(("RUN_DIR", SYNTHETIC), ("--out DIR", "--out coding")), setup="synthetic",
                expect=("coding/nsi_coding_sample.csv",)),
    ".venv/bin/readout nsi-gold RUN_DIR [RUN_DIR...] --gold gold.csv [--rater-a a.csv --rater-b b.csv] "
    "[--groups groups.json] --out DIR": Run(
        "RUN_DIR the synthetic run; gold.csv the exported sample coded by its proxy label (a stand-in for the "
        "human coders); the optional parts left out", subs=(("RUN_DIR", SYNTHETIC), ("--out DIR", "--out gold")),
        needs=(EXPORT,), setup="gold", expect=("gold",)),
    ".venv/bin/readout score examples/probes.jsonl --model smollm2-135m --out scores.jsonl --temperature 0.7": Run(
        "as written on the tiny model", expect=("scores.jsonl",)),
    ".venv/bin/python scripts/power_projection.py --seeds 5 --n-boot 2000": Run(
        "one seed, 50 resamples", subs=(("--seeds 5", "--seeds 1"), ("--n-boot 2000", "--n-boot 50"))),
    ".venv/bin/readout panels validate gap-v2 nsi-14 my-panel.jsonl": Run(
        "my-panel.jsonl: a user's panel, here a copy of gap-v1's file", setup="my-panel"),
    ".venv/bin/readout panels stats gap-v2": Run("as written"),
    ".venv/bin/readout panels show gap-v2 gap2-a1-f2-01 --frame agent --cell twin --order 3 --seed 0 --profile quick": Run(
        "as written"),
    ".venv/bin/readout panels show nsi-14 financial-1 --frame F1 --model tiny-llama3": Run("as written"),
}

_DEPTH_ORGANISM = ("a depth run with the patching grid on 30 held-out scenarios through an organism (about 17 minutes on "
                   "two cores); the grid's cells are held to plain forwards in tests/readouts/gap/test_depth_run.py")
_STEER_GENERAL = ("SmolLM2 with gap-general's adapter on gap-v2's held-out part, three split seeds of a grid with 100 "
                  "random nulls (39 minutes per split seed on two cores); the gated "
                  "tests/readouts/steer/test_steer_organisms.py runs it")
_STEER_READS = "reads the organism steering run above (its stats and report run on tiny-qwen2 in tests/readouts/steer/test_steer_run.py)"

_SERVED_REMOTE = ("sends requests to a remote server (tests send none outside loopback); served runs end to end against "
                  "a vLLM server on 127.0.0.1 are tests/readouts/test_served.py")

NOT_RUN = {
    "make install": "creates .venv from PyPI (network, minutes); this suite runs inside the venv it makes",
    "make test": "the suite itself, this test included",
    ".venv/bin/readout run --model smollm2-135m --peft gap-general --panel gap-v2 --panel-part held-out --set "
    "max_units=1000 --readouts D,J0,J --out runs/gap-general-held-out":
        "the held-out part read through gap-general (about 6 minutes on two cores): the same run, then its stats, is "
        "tests/organisms/test_held_out_known_answers.py's, against the plain forwards",
    ".venv/bin/readout stats runs/gap-general-held-out": "the statistics of the run above (in the same test)",
    ".venv/bin/readout sweep --model allenai/Olmo-3-7B-Instruct@step_100,step_200,step_400 --out sweeps/olmo-rl":
        "three revisions of a 7B model from the hub (tests never download); the same sweep over local folders runs above",
    "HF_HUB_OFFLINE=1 .venv/bin/readout run --model olmo-3-7b --profile paper": "a 7B model at the paper's settings: a GPU node",
    ".venv/bin/readout run --model olmo-3-7b --profile paper-gpu": "a 7B model at the paper's settings: a GPU node",
    ".venv/bin/readout run --model olmo-3-7b --profile paper --window 4": "a 7B model at the paper's settings: a GPU node "
                                                                          "(windows run on tiny models in tests/readouts/test_window.py)",
    ".venv/bin/readout run --model llama-3.1-8b --profile paper --quantize 4bit": "bitsandbytes 4-bit needs CUDA",
    ".venv/bin/readout run --model olmo-3-7b --device-map auto": "one model over several GPUs",
    ".venv/bin/readout run --model olmo-3-7b --profile paper --generator vllm": "a 7B model at the paper's settings: a GPU "
        "node (the generator runs on SmolLM2 in tests/readouts/gap/test_vllm_generator_run.py)",
    ".venv/bin/readout run --model olmo-3-7b --generator vllm --generator-url http://127.0.0.1:8000/v1 --generator-model olmo":
        "a 7B model on a vLLM server of the user's (a pointed-at server runs in tests/readouts/gap/test_vllm_generator_run.py)",
    ".venv/bin/readout nsi --model olmo-3-7b --profile paper --generator vllm": "a 7B model at the paper's settings: a GPU "
        "node (NSI replies drawn by vLLM on SmolLM2 in tests/readouts/nsi/test_vllm_replies.py)",
    "torchrun --nproc_per_node 8 .venv/bin/readout run --model olmo-3-7b --profile paper --out runs/olmo/paper":
        "eight processes, one per GPU",
    "accelerate launch --multi_gpu --num_processes 8 .venv/bin/readout run --model olmo-3-7b --profile paper --out runs/olmo/paper":
        "eight processes, one per GPU (accelerate is not a dependency)",
    "torchrun --nproc_per_node 8 .venv/bin/readout nsi --model olmo-3-7b --profile paper --out runs/olmo/nsi-paper":
        "eight processes, one per GPU",
    "readout run --model smollm2-135m --peft gap-general --panel gap-v2 --panel-part held-out --set max_units=30 "
    "--readouts D,J0,depth --set grid_stride=10 --set patch_stride=0 --set patch_orders=1 --out runs/depth-gap-general":
        _DEPTH_ORGANISM,
    "readout stats runs/depth-gap-general": "the statistics of the run above (docs/depth.md gives what they printed)",
    "readout steer --model smollm2-135m --peft gap-general --panel gap-v2 --panel-part held-out --set max_units=1000 "
    "--layers 21,22,25,28 --strengths=-4,-2,-1,-0.5 --out runs/steer-gap-general": _STEER_GENERAL,
    "readout stats runs/steer-gap-general/seed-0": _STEER_READS,
    "readout report runs/steer-gap-general/seed-0": _STEER_READS,
    ".venv/bin/readout steer --model smollm2-135m --peft gap-general --panel gap-v2 --panel-part held-out "
    "--set max_units=1000 --layers 21,22,25,28 --strengths=-4,-2,-1,-0.5 --out runs/steer-gap-general": _STEER_GENERAL,
    "readout nsi --model openai:allenai/Olmo-3-7B-Instruct@http://gpu-node:8000/v1 --profile paper": _SERVED_REMOTE,
    "export OPENAI_API_KEY=...": "a placeholder for the reader's own key",
    "readout nsi --endpoint https://api.openai.com/v1 --model gpt-4.1-mini --api-key-env OPENAI_API_KEY --profile paper":
        _SERVED_REMOTE,
    "OPENAI_API_KEY=... .venv/bin/readout nsi --endpoint https://api.openai.com/v1 --model gpt-4.1-mini --api-key-env "
    "OPENAI_API_KEY": _SERVED_REMOTE,
    "readout run --model openai:smollm2@http://127.0.0.1:8080/v1 --readouts D,J,J0,control":
        "needs a server at that address; the same run against the vLLM server the tests start on loopback is "
        "tests/readouts/test_served.py::test_gap_quick_run_reads_like_a_local_run",
    "LOGIT_READOUT_SLOW=1 python -m pytest -q -s tests/readouts/gap/test_depth_organisms.py":
        "the organism depth test itself (gated: minutes on two cores)",
    "LOGIT_READOUT_SLOW=1 python -m pytest -q -s tests/readouts/steer/test_steer_organisms.py":
        "the organism steering test itself (gated: minutes on two cores)",
}


# -- inputs no documented command writes ----------------------------------------------------------
def _checkpoints(ws: Path) -> None:
    from engine.tiny import ensure_tiny

    for name in ("step-1000", "step-2000", "step-3000"):
        shutil.copytree(ensure_tiny("tiny-llama3"), ws / "ckpts" / name)


def _checkpoint_list(ws: Path) -> None:
    from engine.tiny import ensure_tiny

    shutil.copytree(ensure_tiny("tiny-llama3"), ws / "ckpts" / "warm")
    (ws / "checkpoints.txt").write_text("# one more checkpoint of the same training run\nckpts/warm\n")


def _synthetic(ws: Path) -> None:
    import numpy as np

    from stats.nsi import acquiescent_rates, write_synthetic_run

    write_synthetic_run(ws / SYNTHETIC, "blind", acquiescent_rates(np.random.default_rng(9), strength=0.8), seed=1,
                        n_samples=10)


def _gold(ws: Path) -> None:
    import pandas as pd

    sample = pd.read_csv(ws / "coding" / "nsi_coding_sample.csv", keep_default_na=False)
    key = pd.read_csv(ws / "coding" / "nsi_coding_key.csv").set_index("item_id")
    proxy = sample["item_id"].map(key["endorse"])
    sample["action_stance"] = ["SUPPORTS_X" if e == 1 else "OPPOSES_X" for e in proxy]
    sample["integrity"] = "CONSISTENT"
    sample.to_csv(ws / "gold.csv", index=False)


def _my_panel(ws: Path) -> None:
    shutil.copy(ROOT / "panels" / "data" / "gap-v1.jsonl", ws / "my-panel.jsonl")


SETUP = {"checkpoints": _checkpoints, "checkpoint-list": _checkpoint_list, "synthetic": _synthetic, "gold": _gold,
         "my-panel": _my_panel}


# -- running one command ------------------------------------------------------------------------------
def makefile_recipe(target: str) -> str:
    """The plain branch of a Makefile target's recipe with the Makefile's variables at their defaults."""
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    defaults = dict(re.findall(r"^(\w+)\s*\?=\s*(\S+)\s*$", make, re.M))
    body = re.search(rf"^{target}:\n((?:\t.*\n|ifdef.*\n|else\n|endif\n)+)", make, re.M).group(1)
    plain = body.split("else\n")[-1].split("endif")[0] if "ifdef" in body else body
    line = plain.strip().splitlines()[0].strip()
    return re.sub(r"\$\((\w+)\)", lambda m: defaults.get(m.group(1), m.group(0)), line)


def as_run(command: str, spec: Run) -> str:
    """The command line that runs here: the documented one with its substitutions, optional parts left out,
    the reduced sizes appended."""
    line = makefile_recipe("readout") if command == "make readout" else command
    assert TINY[0] in line or TINY[0] not in command, command
    line = line.replace(*TINY)
    for old, new in spec.subs:
        assert old in line, f"{command}: the substitution {old!r} does not occur in it"
        line = line.replace(old, new)
    line = " ".join(re.sub(r"\s*\[[^\]]*\]", "", line).split())
    return f"{line} {spec.add}".strip()


def _cpu() -> float:
    import resource

    return time.process_time() + sum(getattr(resource.getrusage(resource.RUSAGE_CHILDREN), f) for f in ("ru_utime", "ru_stime"))


def execute(line: str, ws: Path, fake_bin: Path) -> tuple[int, str]:
    """Run one command line in the scratch folder: `readout` in this process, anything else as a subprocess."""
    words = shlex.split(line)
    env = {}
    while words and re.match(r"^\w+=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    program = re.sub(r"^(\.venv/bin/|\$\(VENV\)/bin/)", "", words[0])
    if program == "readout":
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            try:
                main(words[1:])
            except SystemExit as exc:
                return (exc.code or 0), ""
        return 0, ""
    argv = [sys.executable, *words[1:]] if program == "python" else words
    # PYTHONPATH: this checkout's packages (the venv's editable install may point at another)
    proc = subprocess.run(argv, cwd=ws, env={**os.environ, "SBATCH": str(fake_bin / "sbatch"), "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=1200)
    return proc.returncode, proc.stdout[-1500:] + proc.stderr[-1500:]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A scratch folder laid out like a clone: examples/ and scripts/ linked in, a fake sbatch beside it."""
    ws = tmp_path_factory.mktemp("clone")
    for name in ("examples", "scripts"):
        (ws / name).symlink_to(ROOT / name)
    fake = tmp_path_factory.mktemp("bin")
    (fake / "sbatch").write_text(f'#!/usr/bin/env bash\necho "$*" >> {fake}/sbatch.calls\necho $((1000 + $(wc -l < {fake}/sbatch.calls)))\n')
    (fake / "sbatch").chmod(0o755)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ws)
        yield ws, fake


DOCS = doc_commands()


def test_every_command_is_run_or_listed():
    commands = {c for _, c in DOCS}
    missing = [f"{page}: {c}" for page, c in DOCS if c not in RUN and c not in NOT_RUN]
    assert not missing, "documented commands neither run (RUN) nor listed with a reason (NOT_RUN):\n" + "\n".join(missing)
    stale = sorted(set(RUN) - commands | set(NOT_RUN) - commands)
    assert not stale, "entries of RUN / NOT_RUN that no page holds any more:\n" + "\n".join(stale)
    assert not set(RUN) & set(NOT_RUN)
    assert {p for p, _ in DOCS} >= {"README.md", "gap-study.md", "negation-audit.md", "panels.md"}


def test_every_block_is_a_known_kind():

    kinds = [(page, language) for page, language, _ in blocks()]
    assert all(language in LANGUAGES for _, language in kinds), [k for k in kinds if k[1] not in LANGUAGES]
    python = [body for _, language, body in blocks() if language == "python"]
    assert [b.strip() for b in python] == [readme_example().strip()]  # the one Python example, run by tests/readouts/test_api.py


def test_the_models_file_example_is_a_models_file(tmp_path, capsys):
    (toml,) = [body for _, language, body in blocks() if language == "toml"]
    path = tmp_path / "models.toml"
    path.write_text(toml)
    with pytest.raises(SystemExit) as exc:
        main(["models", "--models", str(path)])
    out = capsys.readouterr().out
    alias = re.search(r'^\["([^"]+)"\]', toml, re.M).group(1)
    assert exc.value.code == 0 and alias in out and str(path) in out


@pytest.mark.heavy  # every command of the docs, in page order: minutes
def test_every_documented_command_runs(workspace, capsys, subtests):
    """Each documented command, in page order, as RUN says (its prerequisites first, each command once)."""
    ws, fake = workspace
    done: dict[str, tuple[float, float]] = {}

    def run(command: str) -> None:
        if command in done:
            return
        spec = RUN[command]
        for need in spec.needs:
            run(need)
        if spec.setup:
            SETUP[spec.setup](ws)
        line = as_run(command, spec)
        start, cpu = time.perf_counter(), _cpu()
        code, tail = execute(line, ws, fake)
        done[command] = (time.perf_counter() - start, _cpu() - cpu)
        out, err = capsys.readouterr()
        assert code == 0, f"{command}\n  ran as: {line}\n  exit {code}\n{(err or tail)[-2500:]}"
        absent = [p for p in spec.expect if not (ws / p).exists()]
        assert not absent, f"{command}\n  ran as: {line}\n  did not write {absent}"

    for page, command in DOCS:
        if command in RUN:
            with subtests.test(msg=f"{page}: {command[:70]}"):
                run(command)
    if os.environ.get("LOGIT_DOCS_TIMES"):  # the cost of each command: wall and CPU seconds (this process and children)
        with capsys.disabled():
            print("\n" + "\n".join(f"{w:7.1f}s wall {c:6.1f}s cpu  {k}" for k, (w, c) in sorted(done.items(), key=lambda x: -x[1][1])))
    calls = (fake / "sbatch.calls").read_text().splitlines()
    assert sum("--array=" in c for c in calls) == 4 and any("--partition=gpu --account=lab" in c for c in calls)
    assert json.loads((ws / GAP / "manifest.json").read_text())["model"]["name"] == "tiny-qwen2"


def _rest(line: str) -> str | None:
    m = re.match(r"^(?:\w+=\S+\s+)*(?:\.venv/bin/|\$\(VENV\)/bin/)?readout\s+(.*)$", line)
    return m.group(1) if m else None


PARSED = [(p, _rest(c)) for p, c in DOCS if _rest(c) and not re.search(r"<[^>]*>|\.\.\.|\bRUN_|\bDIR\b|\|", c)]


def test_the_pages_hold_commands():
    assert len(PARSED) >= 20 and {p for p, _ in PARSED} >= {"README.md", "gap-study.md", "negation-audit.md"}


@pytest.mark.parametrize("page, line", PARSED, ids=[f"{p}:{line[:40]}" for p, line in PARSED])
def test_every_documented_command_parses(page, line):
    """Run or not: the command's options, types, bounds and required arguments against its command line."""
    args = shlex.split(re.sub(r"\s*\[[^\]]*\]", "", line))
    ctx = cli.make_context("readout", args)
    while isinstance(ctx.command, click.Group):
        name, cmd, rest = ctx.command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        ctx = cmd.make_context(name, rest, parent=ctx)
    assert ctx.command.name
