"""make gpu-prep's choice of wheels (planted images), and scripts/gpu_check.sh in a fresh venv that holds only torch
and the wheels gpu_prep.py chose for it: what a GPU node with nothing installed but torch would run."""

import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("gpu_prep", ROOT / "scripts" / "gpu_prep.py")
gpu_prep = sys.modules.setdefault("gpu_prep", importlib.util.module_from_spec(_spec))  # dataclasses look it up
_spec.loader.exec_module(gpu_prep)

# make install: scripts/gpu_prep.py --image bare --dest .whl-bare (scripts/mutants.py points its copy here)
BARE_WHEELS = Path(os.environ.get("LOGIT_READOUT_BARE_WHEELS", ROOT / ".whl-bare"))
REQUIRE_ENV = "LOGIT_READOUT_REQUIRE_GPU_WHEELS"  # .ci/run sets it: a missing .whl-bare fails instead of skipping


def _reqs(table):
    return lambda name: (table[name][0], [Requirement(r) for r in table[name][1]])


TESTED = {  # name -> (tested version, requirements)
    "tf": ("5.23.0", ["hub>=1.31,<3", "tok>=0.23.1,<0.24", "regex>=2025.10.22", "tqdm"]),
    "tok": ("0.23.3", ["hub>=0.16"]),
    "hub": ("2.4.0", ["httpx2>=2"]),
    "regex": ("2026.11.19", []),
    "tqdm": ("4.70.1", []),
    "httpx2": ("2.16.2", []),
    "pd": ("3.1.1", ["dateutil>=2.9"]),
    "dateutil": ("4.0.0", []),
    "torch": ("2.13.0", ["sympy"]),
}


def test_plan_carries_what_the_image_lacks_or_holds_out_of_range():
    image = gpu_prep.Image("3.12", {"tf": "5.17.0", "tok": "0.23.2", "hub": "1.33.0", "regex": None, "tqdm": None,
                                    "pd": "2.3.0", "torch": "2.11.0"})
    roots = ("tf", "tok", "pd", "torch")
    specs = {"tf": SpecifierSet(">=5.23,<5.24"), "tok": SpecifierSet(">=0.23,<0.24"), "pd": SpecifierSet(">=2.2"),
             "torch": SpecifierSet(">=2.13")}
    carried, assumed = gpu_prep.plan_carry(roots, specs, _reqs(TESTED), image, provided=("torch",))
    # tf: held out of the project's range; regex: held, version not listed, bounded by tf; the rest are left
    # to the image: tok 0.23.2 and hub 1.33.0 satisfy every bound, pd 2.3.0 the project's (so its own needs
    # are the image's), tqdm is unbounded, torch is the node's own whatever its version.
    assert set(carried) == {"tf", "regex"}
    assert carried["tf"] == ("5.23.0", "the image holds 5.17.0; the project needs <5.24,>=5.23")
    assert carried["regex"][1] == "the image's version is not listed; tf 5.23.0 needs >=2025.10.22"
    assert assumed == ["tqdm"]
    # A carried package's bound that the image's version fails carries that one too, and walks its needs.
    older = gpu_prep.Image("3.12", {**image.packages, "hub": "0.30.0"})
    carried, _ = gpu_prep.plan_carry(roots, specs, _reqs(TESTED), older, provided=("torch",))
    assert set(carried) == {"tf", "regex", "hub", "httpx2"}
    assert carried["hub"][1] == "the image holds 0.30.0; tf 5.23.0 needs <3,>=1.31"
    # An image with nothing but torch: everything the roots need, torch's own needs left out.
    bare = gpu_prep.Image("3.11", {"torch": "2.13.0", "sympy": "1.14"})
    carried, assumed = gpu_prep.plan_carry(roots, specs, _reqs(TESTED), bare, provided=("torch",))
    assert set(carried) == set(TESTED) - {"torch"} and assumed == []
    assert all(reason == "absent from the image" for _, reason in carried.values())


def test_the_h200_plan_carries_transformers_and_not_what_the_image_holds_in_range():
    image = gpu_prep.h200_image()
    carried, assumed = gpu_prep.plan_carry(gpu_prep.ROOTS, gpu_prep.project_specs(),
                                           lambda n: gpu_prep.installed_requirements(n, image.python), image)
    assert carried["transformers"][0] == metadata.version("transformers")
    assert "the image holds 5.17.0" in carried["transformers"][1]
    for held_in_range in ("tokenizers", "safetensors", "numpy", "huggingface-hub", "torch"):
        assert held_in_range not in carried


def test_the_carried_working_tree_counts_tracked_and_untracked_files_not_ignored(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text(".whl/\nbig.bin\n")  # 14 bytes
    (repo / "tracked.py").write_bytes(b"x" * 1000)
    subprocess.run(["git", "-C", str(repo), "add", ".gitignore", "tracked.py"], check=True)
    (repo / "untracked.txt").write_bytes(b"y" * 200)  # not ignored: it travels
    (repo / "big.bin").write_bytes(b"z" * 5000)  # ignored: it stays
    (repo / ".whl").mkdir()
    (repo / ".whl" / "a.whl").write_bytes(b"w" * 3000)  # ignored, and counted apart as the wheels
    (repo / "shared").mkdir()
    (repo / "shared" / "notes.md").write_bytes(b"s" * 40)
    assert gpu_prep.repository_bytes(repo) == 14 + 1000 + 200 + 40
    assert gpu_prep.repository_bytes(repo, leave_out=(repo / "shared",)) == 14 + 1000 + 200
    assert gpu_prep.repository_bytes(ROOT) > 2**20  # this checkout's own files


def test_gpu_prep_refuses_when_the_repository_and_the_wheels_together_exceed_the_limit(tmp_path, monkeypatch, capsys):
    """The device tool's limit holds the whole working tree: wheels that fit alone are refused when the repository's
    own files take them over, in one line naming each part."""
    def planted_download(carried, image, dest):
        dest.mkdir(parents=True, exist_ok=True)
        wheel = dest / "planted-1.0-py3-none-any.whl"
        wheel.write_bytes(b"0" * 2**20)
        return [wheel]

    monkeypatch.setattr(gpu_prep, "download", planted_download)
    repository = gpu_prep.repository_bytes(ROOT) / 2**20
    dest = tmp_path / "whl"
    with pytest.raises(SystemExit) as exc:
        gpu_prep.main(["--dest", str(dest), "--no-tokenizer", "--limit-mib", f"{1 + repository / 2:.1f}"])
    message = str(exc.value)
    assert message.startswith(f"error: {dest}:") and "\n" not in message
    assert "wheels 1.0 MiB" in message and f"repository {repository:.1f} MiB" in message
    gpu_prep.main(["--dest", str(dest), "--no-tokenizer", "--limit-mib", f"{2 + repository:.1f}"])
    carried = json.loads((dest / "carried.json").read_text())
    assert carried["bytes_by_part"]["wheels"] == 2**20 and carried["bytes_by_part"]["repository"] > 2**20
    assert carried["bytes"] == sum(carried["bytes_by_part"].values())


def _torch_only_venv(tmp_path: Path) -> Path:
    """A new venv whose only packages beyond pip are torch and what torch requires, linked from this checkout's
    .venv through a .pth (copying torch would take a minute)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    linked = tmp_path / "torch-only"
    linked.mkdir()
    for name in gpu_prep.bare_image().packages:
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__"}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (linked / top).exists():
                (linked / top).symlink_to(source)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "torch-only.pth").write_text(f"{linked}\n")
    return venv / "bin" / "python"


@pytest.mark.heavy
@pytest.mark.smollm
def test_gpu_check_sh_runs_in_a_venv_holding_only_torch_and_the_wheels(tmp_path):
    if not any(BARE_WHEELS.glob("*.whl")):
        message = f"{BARE_WHEELS} is empty: make install fills it (scripts/gpu_prep.py --image bare)"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(message)
        pytest.skip(message)
    python = _torch_only_venv(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    probe = "import torch\ntry:\n import transformers\nexcept ImportError:\n print('bare', torch.__version__)"
    fresh = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env)
    assert fresh.stdout.startswith("bare 2."), fresh.stderr[-2000:]  # torch imports, transformers does not
    carried = json.loads((BARE_WHEELS / "carried.json").read_text())
    image = gpu_prep.bare_image()
    planned, _ = gpu_prep.plan_carry(gpu_prep.ROOTS, gpu_prep.project_specs(),
                                     lambda n: gpu_prep.installed_requirements(n, image.python), image)
    assert carried["image"] == "bare" and set(carried["carried"]) == set(planned), "stale: rerun make install"

    from engine import embedded

    tokenizer = embedded.ensure_smollm2()
    # One architecture leaves room under the 540 s the limits must add up to for a slower CPU's parts.
    env.update(PYTHON=str(python), WHEELS=str(BARE_WHEELS), SITE=str(tmp_path / "site"), OUT=str(tmp_path),
               ARCH="llama3", FAMILIES="tiny-llama3", DRAW_SHAPES="2x1500", SETUP_SECONDS="100", EQUAL_SECONDS="100",
               DRAW_SECONDS="50", ARCH_SECONDS="160", GEN_SECONDS="60")
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--tiny", "--tokenizer", str(tokenizer)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # The script's own log, in the output folder: everything it printed, each part's stdout and stderr.
    log = (tmp_path / "gpu_check.log").read_text()
    assert log.startswith("time limits: ") and "under 540 s" in log.splitlines()[0]
    assert all(line in log for line in proc.stdout.splitlines() + proc.stderr.splitlines())
    for part in ("gpu_equal", "draw_bench", "gpu_check llama3", "generators llama3", "gpu_results"):
        assert f"part {part}: done in " in log, log[-3000:]
    assert "gpu_equal on cpu (cpu): 7 of 7 checks passed" in log and "D readout:" in log
    assert f"prompt tokenizer: {tokenizer}" in proc.stdout
    assert "D readout:" in proc.stdout and "decode batch 1, static shapes" in proc.stdout
    result = json.loads((tmp_path / "gpu_check_llama3.json").read_text())
    assert result["d_probes"] == 32 and len(result["decode"]) == 4
    assert result["complete"] and result["parts_done"] == ["d", "gen", "decode", "grid", "generate_per_step"]
    assert result["shape_set"] == "h200" and result["shape_set_reason"] == "no CUDA device: the largest set"
    assert all(row["greedy_equal_to_dynamic"] and row["rows_equal"] == row["rows"]
               for row in result["decode"] if "greedy_equal_to_dynamic" in row)
    assert result["step_grid"] and all(row["seconds_per_step"] > 0 for row in result["step_grid"])
    assert all(len(row["seconds_per_step_by_span"]) == 3 for row in result["step_grid"])  # 64, 128, 160
    assert result["generate_per_step"]["rows"] >= 1 and result["generate_per_step"]["seconds_per_step"] > 0
    assert "the draw over the whole vocabulary at top-p 1" in proc.stdout  # bench/gpu_results.py's table of the run
    generators = json.loads((tmp_path / "gpu_generators_llama3.json").read_text())
    assert generators["complete"] and generators["parts_done"] == ["generators"]
    dynamic = generators["generators"]["paths"]["dynamic"]
    assert dynamic["sampled_equal_across_batchings"] == dynamic["sampled_total"] > 0
    assert "| own, dynamic path | " in proc.stdout
    draws = json.loads((tmp_path / "draw_bench.json").read_text())["draws"]
    assert [(d["rows"], d["vocab"]) for d in draws] == [(2, 1500)] and draws[0]["blocks_ms"] > 0
    equal = json.loads((tmp_path / "gpu_equal.json").read_text())  # the graph path's checks, eager on CPU
    assert equal["complete"] and len(equal["results"]) == 7 and all(r["ok"] and r["family"] == "tiny-llama3" for r in equal["results"])

    # Without the wheels the same venv is refused in one line naming what it lacks.
    env.update(WHEELS=str(tmp_path / "no-wheels"))
    bare = subprocess.run(["bash", "scripts/gpu_check.sh", "--tiny"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert bare.returncode == 2 and "cannot import torch and transformers" in bare.stderr
    assert "cannot import torch and transformers" in (tmp_path / "gpu_check.log").read_text()
