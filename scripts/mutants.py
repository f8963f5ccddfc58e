"""Mutation check: apply each listed behaviour-breaking edit to a scratch copy of the repository, one at a
time, run the tests that should catch it, and report which were caught. Not part of CI (`make mutants`).

The edits live in tests/mutants/*.toml, one `[[mutant]]` table each:

    id      = "greedy-second-best"                  # unique, short
    file    = "engine/generation.py"                # repository-relative
    find    = "best = logits.argmax(-1)"            # exact text; must occur exactly once in the file
    replace = "best = logits.topk(2, -1).indices[:, 1]"
    tests   = ["tests/engine/test_decode.py::test_greedy_equals_the_plain_decoder"]   # pytest arguments
    why     = "greedy takes the second most likely token"

An edit is caught when its tests fail (pytest exit status 1). A `find` that no longer matches exactly once is
reported as stale (the list must follow the code when it moves); a mutant whose tests cannot even be collected
(exit status 2-5) is reported as an error, not as caught. Before any edit the listed tests must pass on the
unmodified copy. Exit status 0 only when every selected edit is caught.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LISTS = ROOT / "tests" / "mutants"


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str
    source: str  # the list file it came from


def load_mutants(folder: Path = LISTS) -> list[Mutant]:
    """Every mutant of every list, checked for the fields and for unique ids (errors name the file and entry)."""
    out: list[Mutant] = []
    seen: dict[str, str] = {}
    fields = ("id", "file", "find", "replace", "tests", "why")
    for path in sorted(folder.glob("*.toml")):
        with path.open("rb") as fh:
            entries = tomllib.load(fh).get("mutant", [])
        for k, entry in enumerate(entries):
            where = f"{path.relative_to(ROOT)}: mutant {k + 1}"
            missing = [f for f in fields if f not in entry]
            if missing:
                raise SystemExit(f"error: {where}: missing field(s) {', '.join(missing)}")
            if entry["id"] in seen:
                raise SystemExit(f"error: {where}: id '{entry['id']}' already used in {seen[entry['id']]}")
            if entry["find"] == entry["replace"]:
                raise SystemExit(f"error: {where}: 'replace' equals 'find'")
            seen[entry["id"]] = str(path.relative_to(ROOT))
            out.append(Mutant(entry["id"], entry["file"], entry["find"], entry["replace"], tuple(entry["tests"]),
                              entry["why"], path.name))
    return out


def scratch_copy(dest: Path) -> None:
    """The repository's tracked and untracked-but-not-ignored files, copied to `dest`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_tests(copy: Path, tests, timeout: int) -> tuple[int, str]:
    env_path = str(copy)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests]
    try:
        done = subprocess.run(cmd, cwd=copy, env={**_env(), "PYTHONPATH": env_path}, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    tail = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, tail[-1] if tail else ""


def _env() -> dict:
    """The tests' environment; the scratch copy has no .venv-served, so the served tests are pointed at this
    checkout's vLLM (tests/served_helpers.py)."""
    import os

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from engine.vllm_server import SERVER_PYTHON_ENV, server_python

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    served = server_python()
    if served is not None:
        env.setdefault(SERVER_PYTHON_ENV, served)
    if (ROOT / ".whl-bare").is_dir():  # the fresh-venv gpu_check test's wheels (make install)
        env.setdefault("LOGIT_READOUT_BARE_WHEELS", str(ROOT / ".whl-bare"))
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="mutant ids (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per test run")
    args = ap.parse_args()
    mutants = load_mutants()
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            raise SystemExit(f"error: --only: unknown mutant id(s) {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.id:32s} {m.file:36s} {m.why}")
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        copy = Path(tmp)
        scratch_copy(copy)
        baseline = sorted({t for m in mutants for t in m.tests})
        rc, last = run_tests(copy, baseline, args.timeout * 4)
        if rc != 0:
            print(f"error: the listed tests do not pass on the unmodified code (pytest exit {rc}): {last}", file=sys.stderr)
            return 2
        print(f"baseline: {len(baseline)} test selections pass on the unmodified code", flush=True)
        for m in mutants:
            target = copy / m.file
            original = target.read_text() if target.is_file() else None
            count = original.count(m.find) if original is not None else 0
            if count != 1:
                status, detail = "STALE", f"'find' occurs {count} times in {m.file}"
            else:
                target.write_text(original.replace(m.find, m.replace))
                t0 = time.perf_counter()
                try:
                    rc, last = run_tests(copy, m.tests, args.timeout)
                finally:
                    target.write_text(original)
                status = {0: "MISSED", 1: "caught"}.get(rc, "ERROR")
                detail = f"{time.perf_counter() - t0:.0f} s; {last}"
            results.append((m, status))
            print(f"{status:7s} {m.id:32s} {m.why} [{detail}]", flush=True)
    caught = sum(s == "caught" for _, s in results)
    print(f"\n{caught} of {len(results)} edits caught")
    for m, s in results:
        if s != "caught":
            print(f"  {s}: {m.id} ({m.source}): {m.why}")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
