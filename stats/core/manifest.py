"""Reading a run directory's manifest for the analyses: the run must be of the kind the command reads and
complete; a missing manifest is allowed (tables copied without it) and said in the notes.
"""

from __future__ import annotations

import json
from pathlib import Path

from contract.options import PAPER_PROFILES
from stats.core.errors import RunDirError

MANIFEST = "manifest.json"
COMMAND_OF_KIND = {"judgment-action": "readout stats", "nsi": "readout nsi-stats"}


def read_run_manifest(run_dir: str | Path, kind: str) -> tuple[dict, list[str]]:
    """(manifest or {}, notes). RunDirError when the manifest is unreadable, of another kind, or incomplete."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        return {}, [f"{MANIFEST} absent: model and panel names taken from the table, completeness not checked"]
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict):
        raise RunDirError(f"{path}: not a JSON object")
    found = manifest.get("kind")
    if found is not None and found != kind:
        other = COMMAND_OF_KIND.get(found, "another command")
        raise RunDirError(f"{path}: kind: this is a {found} run, not a {kind} run; read it with {other}")
    if manifest.get("complete") is False:
        done, total = len(manifest.get("chunks") or ()), manifest.get("n_chunks")
        raise RunDirError(f"{path}: complete: the run has not finished ({done} of {total} chunks); give the same "
                          "command again, or `readout merge` after sharded jobs")
    return manifest, []


def settings_note(manifest) -> str | None:
    """One line saying that a run was not read at the paper's settings (a profile other than the paper's, profile
    overrides, --limit), so its numbers are not comparable with the paper's; None when it was (or is not known)."""
    profile = manifest.get("profile") if isinstance(manifest, dict) else None
    name = profile.get("name") if isinstance(profile, dict) else profile
    if name is None:
        return None
    why = [] if name in PAPER_PROFILES else [f"profile '{name}'"]
    overrides = manifest.get("overrides") or {}
    if overrides:
        why.append("--set " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
    if manifest.get("limit"):
        why.append(f"--limit {manifest['limit']}")
    if not why:
        return None
    return (f"note: not the paper's settings ({'; '.join(why)}): these numbers are not comparable with the paper's "
            "(rerun with --profile paper)")
