"""The studies a caller names: "gap", the judgment-action study (`readout run`), and "nsi", the framing-stability
audit (`readout nsi`). One map, read by the Python API (`run_study`) and by `readout sweep --study`."""

from __future__ import annotations

from engine.errors import ReadoutError

STUDIES = {"gap": "the judgment-action study, compared with `readout compare`",
           "nsi": "the framing-stability audit, compared with `readout nsi-stats`"}
"""The study names, with what each is and what compares its runs."""


def study_named(kind: str, *, readouts: str | None = None, sample: bool = False):
    """The study called `kind`; `readouts` and `sample` are the gap study's own options (refused for nsi)."""
    if kind == "gap":
        from readouts.gap.study import GapStudy

        return GapStudy(readouts=readouts, sample=sample)
    if kind == "nsi":
        if readouts is not None or sample:
            raise ReadoutError("--readouts / --sample: options of the gap study, not of --study nsi")
        from readouts.nsi.study import NsiStudy

        return NsiStudy()
    raise ReadoutError(f"study: '{kind}' is not one of {', '.join(STUDIES)}")
