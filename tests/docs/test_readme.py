"""README.md as a front door: short (100 to 150 lines), citing both papers, with a glossary of
the terms every output uses and a licence line, and pointing only at files that are in the repository. Its command
blocks run in tests/cli/test_docs_commands.py."""

import re
import tomllib

from readouts.report.gather import REPORT_FILES
from tests.helpers import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
PAPERS = ("Principled Under Pressure: Post-Training Decides Whether LLMs Act on Their Own Moral Judgment",
          "Framing Instability in LLM Ethical Stance: Auditing Negation Sensitivity in Moral Dilemmas")
"""The two papers' titles, as their first lines give them."""
GLOSSARY = ("D", "J", "J0", "twin", "screen", "g", "E", "L0", "NSI")


def flat(text: str) -> str:
    """Text with its line breaks and markdown emphasis gone: a title wrapped over two lines still reads as one."""
    return " ".join(text.replace("*", "").split())


def sections() -> dict[str, str]:
    """The README's `## ` sections by heading, the text before the first one under ''."""
    parts = re.split(r"^## +(.+)$", README, flags=re.M)
    return {"": parts[0], **{parts[k].strip(): parts[k + 1] for k in range(1, len(parts), 2)}}


def test_the_readme_is_short():
    assert 100 <= len(README.splitlines()) <= 150, len(README.splitlines())


def test_the_readme_cites_both_papers_up_front_and_in_its_citation():
    intro, citation = flat(sections()[""]), flat(sections()["Citation"])
    for title in PAPERS:
        assert title in intro and title in citation, title


def test_the_glossary_defines_every_term_the_outputs_use():
    rows = [line for line in sections()["Glossary"].splitlines() if line.startswith("|")]
    defined = {}
    for row in rows[2:]:  # after the header and its rule
        term, meaning = [c.strip() for c in row.strip("|").split("|")][:2]
        defined[term] = meaning
    for term in GLOSSARY:  # "L0–L2" defines L0
        assert any(re.fullmatch(rf"{re.escape(term)}(\W.*)?", t) and defined[t] for t in defined), term


def test_the_readme_has_a_licence_line_matching_the_package():
    licence = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]["text"]
    body = sections().get("Licence") or sections().get("License")
    assert body is not None and licence in body, body


def test_the_readme_points_only_at_files_in_the_repository():
    """Every link target, every repository path (docs/..., tests/..., ...) and every *.md named exists; the *.md a
    stats command writes into a run's folder (report.md, ...) is output, not a file of the repository."""
    links = [t for t in re.findall(r"\]\(([^)\s]+)\)", README) if not re.match(r"[a-z]+://|#", t)]
    assert links  # the common tasks link their pages
    paths = re.findall(r"(?<![\w./-])((?:docs|tests|examples|scripts|panels|stats|readouts|engine|contract)/[\w./-]*\w)",
                       README)
    named = [m for m in re.findall(r"(?<![\w/.-])([\w-]+\.md)\b", README) if m not in REPORT_FILES]
    missing = [p for p in [*links, *paths] if not (ROOT / p.split("#")[0]).exists()]
    missing += [m for m in named if not ((ROOT / m).exists() or (ROOT / "docs" / m).exists())]
    assert missing == []
    assert "DESIGN.md" not in README or (ROOT / "DESIGN.md").exists()


def test_no_source_or_page_points_to_a_design_md_that_is_not_there():
    """Neither the README nor any docstring points to DESIGN.md, which is not in the repository."""
    if (ROOT / "DESIGN.md").exists():
        return
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    files += [p for d in ("contract", "engine", "panels", "readouts", "stats", "scripts") for p in (ROOT / d).rglob("*.py")]
    assert [str(p.relative_to(ROOT)) for p in files if "DESIGN.md" in p.read_text(encoding="utf-8")] == []
