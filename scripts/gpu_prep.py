"""make gpu-prep: the wheels a GPU node's image lacks, or holds in a version the project was not tested with, for
the packages scripts/gpu_check.py imports, downloaded for the node's Python into .whl/ (carried with the device
call; gpu_check.sh installs them from there with no index), and the embedded model's real tokenizer into
.gpu-tokenizer/. What is carried, and why, is printed and written to .whl/carried.json.

    python scripts/gpu_prep.py                      # for the lent H200 image (CPython 3.12, manylinux x86-64)
    python scripts/gpu_prep.py --image bare --dest .whl-bare --no-tokenizer
                                                    # for a venv holding only torch, on this machine's Python
                                                    # (what tests/scripts/test_gpu_prep.py runs gpu_check.sh in)

The versions carried are the ones installed in this checkout's .venv (the tested ones); their requirements are
read from the same metadata, with markers evaluated for the node's Python. A package the image holds is left to
the image when its version satisfies every requirement placed on it (the project's range for a direct
dependency, each carried package's for the rest); one it holds in a version not listed is left to it only when
nothing bounds its version (said so), and carried otherwise.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 64  # the device tool carries at most 64 MiB of working tree a call
# What scripts/gpu_check.py imports through engine/, panels/ and contract/ (tests/scripts/test_gpu_prep.py runs
# it in a venv holding only torch and these wheels, so a missing name fails there).
ROOTS = ("transformers", "tokenizers", "safetensors", "numpy", "pandas", "jinja2", "tqdm")
# Never carried: the node's torch is its CUDA build (torch 2.11 on the lent H200; the project's range starts at
# 2.13, and gpu_check runs on the node's own torch all the same).
PROVIDED = ("torch",)
MANYLINUX = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
# The lent H200 image ('cuda'), as /work/.library/device/KINDS.md lists it (2026-11-17): versions where a pip list
# read them, None where only the name is known.
H200_VERSIONS = {"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
                 "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
                 "transformers": "5.17.0", "triton": "3.6.0"}
H200_NAMES = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cycler cython einops filelock
fonttools fsspec h11 h5py hf-xet httpcore httpx huggingface-hub idna iniconfig jinja2 joblib kiwisolver lxml markdown
markdown-it-py markupsafe matplotlib mdurl mpmath msgpack multidict networkx ninja numpy packaging pandas patsy peft
pillow pip pluggy protobuf psutil pyarrow pygments pyparsing python-dateutil pytest pytest-xdist pyyaml regex requests
rich safetensors scikit-learn scipy seaborn sentencepiece setuptools shellingham six statsmodels sympy tabulate
threadpoolctl tiktoken tokenizers torch tqdm transformers triton typer typing-extensions urllib3 wheel zipp""".split()


@dataclass
class Image:
    python: str  # "3.12"
    packages: dict[str, str | None]  # canonical name -> version held (None: held, version not read)
    platforms: tuple[str, ...] = ()  # pip download --platform tags; () = this machine's own
    notes: list[str] = field(default_factory=list)


def h200_image() -> Image:
    held = {canonicalize_name(n): None for n in H200_NAMES}
    held.update({canonicalize_name(n): v for n, v in H200_VERSIONS.items()})
    return Image("3.12", held, MANYLINUX)


def bare_image() -> Image:
    """A venv on this machine's Python holding only torch and what torch requires (as installed here)."""
    held: dict[str, str | None] = {}
    todo = list(PROVIDED)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in held:
            continue
        dist = metadata.distribution(name)
        held[name] = dist.version
        todo += [r.name for r in map(Requirement, dist.requires or []) if r.marker is None or r.marker.evaluate({**_env(_py()), "extra": ""})]
    return Image(_py(), held)


IMAGES = {"cuda": h200_image, "bare": bare_image}


def _py() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _env(python: str) -> dict[str, str]:
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0", platform_machine="x86_64",
               sys_platform="linux", platform_system="Linux", os_name="posix", implementation_name="cpython",
               platform_python_implementation="CPython")
    return env


def installed_requirements(name: str, python: str) -> tuple[str, list[Requirement]]:
    """The tested version of `name` (this venv's) and its requirements that apply on `python` (no extras)."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        raise SystemExit(f"error: {name} is needed but not installed in {sys.prefix}: run make install first "
                         f"(the versions carried are the ones installed there)") from None
    env = _env(python)
    reqs = [r for r in map(Requirement, dist.requires or [])
            if r.marker is None or r.marker.evaluate({**env, "extra": ""})]
    return dist.version, reqs


def project_specs() -> dict[str, SpecifierSet]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {canonicalize_name(r.name): r.specifier for r in map(Requirement, deps)}


def plan_carry(roots, root_specs, requirements, image: Image, provided=PROVIDED):
    """Which packages to carry, each with its tested version and the reason, and which the image is assumed to
    satisfy. `requirements(name) -> (version, [Requirement])` reads the tested versions; a package the image holds
    in a version that satisfies every specifier placed on it (the project's for roots, each carried package's for
    its own requirements) is left to the image, and its requirements to the image too; one held in a version not
    listed is left to it only when no specifier bounds it."""
    specs: dict[str, list[tuple[str, SpecifierSet]]] = {}
    for name in roots:
        key = canonicalize_name(name)
        specs.setdefault(key, []).append(("the project", root_specs.get(key, SpecifierSet())))
    carried: dict[str, tuple[str, str]] = {}
    assumed: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name in sorted(specs):
            if name in carried or name in provided:
                continue
            held = image.packages.get(name, "absent")
            if held == "absent":
                reason = "absent from the image"
            elif held is None:  # held, version not listed: only an unbounded requirement can be left to it
                bounded = [(who, s) for who, s in specs[name] if str(s)]
                if not bounded:
                    assumed.add(name)
                    continue
                reason = "the image's version is not listed; " + ", ".join(f"{who} needs {s}" for who, s in bounded)
            else:
                failing = [(who, s) for who, s in specs[name] if not s.contains(Version(held), prereleases=True)]
                if not failing:
                    continue
                reason = f"the image holds {held}; " + ", ".join(f"{who} needs {s}" for who, s in failing)
            version, reqs = requirements(name)
            carried[name] = (version, reason)
            assumed.discard(name)
            for r in reqs:
                specs.setdefault(canonicalize_name(r.name), []).append((f"{name} {version}", r.specifier))
            changed = True
    return carried, sorted(assumed)


def download(carried, image: Image, dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):  # one version of each: two stop the whole install on the node
        old.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    if image.platforms:
        cmd += ["--python-version", image.python, "--implementation", "cp"]
        for tag in image.platforms:
            cmd += ["--platform", tag]
    specs = [f"{name}=={version}" for name, (version, _) in sorted(carried.items())]
    if specs:
        proc = subprocess.run(cmd + specs, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: pip download for {dest} failed: {proc.stderr.strip().splitlines()[-1]}")
    wheels = sorted(dest.glob("*.whl"))
    names = {canonicalize_name(w.name.split("-")[0]) for w in wheels}
    if names != set(carried) or len(wheels) != len(carried):
        raise SystemExit(f"error: {dest}: expected one wheel for each of {sorted(carried)}, found {[w.name for w in wheels]}")
    return wheels


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def repository_bytes(root: Path = ROOT, leave_out=()) -> int:
    """Bytes of the working tree that travels with every device call: the tracked files and the untracked ones git
    does not ignore (as they are on disk), and a shared/ folder inside the checkout; files under `leave_out` (counted
    apart) are left out."""
    proc = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {root}: git ls-files failed, so the carried working tree cannot be measured: "
                         f"{(proc.stderr.strip().splitlines() or ['no reason given'])[-1]}")
    root = Path(root).resolve()
    skip = [Path(p).resolve() for p in leave_out]
    files = {root / name for name in proc.stdout.split("\0") if name}
    if (root / "shared").is_dir():
        files |= {f for f in (root / "shared").rglob("*") if f.is_file()}
    return sum(f.stat().st_size for f in files
               if f.is_file() and not f.is_symlink() and not any(f.is_relative_to(s) for s in skip))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", choices=sorted(IMAGES), default="cuda")
    ap.add_argument("--dest", default=str(ROOT / ".whl"))
    ap.add_argument("--no-tokenizer", action="store_true", help="leave .gpu-tokenizer/ as it is")
    ap.add_argument("--limit-mib", type=float, default=LIMIT_MIB,
                    help="refuse when the wheels, the tokenizer and (for the cuda image) the repository's own files "
                         "together exceed this (the device tool's carry limit)")
    args = ap.parse_args(argv)
    image = IMAGES[args.image]()
    carried, assumed = plan_carry(ROOTS, project_specs(), lambda n: installed_requirements(n, image.python), image)
    dest = Path(args.dest)
    wheels = download(carried, image, dest)
    for name, (version, reason) in sorted(carried.items()):
        print(f"carry {name}=={version}: {reason}")
    if assumed:
        print(f"left to the image (held, version not listed): {', '.join(assumed)}")
    if not args.no_tokenizer:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--prepare-tokenizer"], check=True)
    tokenizer = ROOT / ".gpu-tokenizer"
    sizes = {"wheels": sum(w.stat().st_size for w in wheels)}
    if not args.no_tokenizer:
        sizes["tokenizer"] = folder_bytes(tokenizer)
    if args.image == "cuda":  # what travels with the device call: the repository's own files too
        sizes["repository"] = repository_bytes(ROOT, leave_out=(dest, tokenizer))
    total = sum(sizes.values())
    (dest / "carried.json").write_text(json.dumps(
        dict(image=args.image, python=image.python, machine=platform.machine(), assumed=assumed,
             carried={n: dict(version=v, reason=r) for n, (v, r) in sorted(carried.items())},
             wheels=[w.name for w in wheels], bytes=total, bytes_by_part=sizes), indent=2) + "\n")
    parts = ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in sizes.items())
    print(f"{len(wheels)} wheels in {dest}; to carry: {parts}; {total / 2**20:.1f} MiB in all")
    if total > args.limit_mib * 2**20:
        raise SystemExit(f"error: {dest}: {total / 2**20:.1f} MiB to carry ({parts}), over the device tool's "
                         f"{args.limit_mib:g} MiB limit (--limit-mib)")
    if args.image == "cuda":
        print("carry with the device call: .whl .gpu-tokenizer; then run bash scripts/gpu_check.sh")


if __name__ == "__main__":
    main()
