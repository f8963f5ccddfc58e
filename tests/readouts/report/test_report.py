"""`readout report`: one self-contained HTML page over a gap run, an NSI run and a comparison folder (figures
embedded, tables, manifest, drill-down), text escaped, one-line errors; and the page in headless Chromium: no
console errors, every figure decodes, the drill-down renders."""

import base64
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from contract.tables import PROMPT_TEXT
from readouts.report import write_report
from readouts.report.gather import DEFAULT_ITEMS
from stats.gap import compare_runs, run_report
from stats.nsi import run_nsi_stats
from tests.helpers import cli, make_gap_run, make_nsi_run

CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A gap run with its stats (mass floor 0: a tiny model's letters carry little mass), an NSI run with its
    stats, and a comparison folder."""
    root = tmp_path_factory.mktemp("report")
    gap = make_gap_run(root / "gap")
    run_report(gap, n_boot=50, mass_floor=0.0)
    nsi = make_nsi_run(root / "nsi")
    run_nsi_stats([nsi], None, seed=0, n_null=50, n_boot=50)
    cmp = root / "cmp"
    compare_runs([gap], cmp, n_boot=50)
    return gap, nsi, cmp


@pytest.fixture(scope="module")
def page(folders, tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "report.html"
    lines = write_report(list(folders), out)
    return out, lines


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def tags(html: str):
    parser = Tags()
    parser.feed(html)
    return parser.tags


def test_page_holds_every_figure_table_manifest_and_item(folders, page):
    gap, nsi, cmp = folders
    out, lines = page
    html = out.read_text(encoding="utf-8")
    found = tags(html)
    pngs = [p for d in (gap / "stats", nsi / "stats", cmp) for p in sorted(d.glob("*.png"))]
    assert len(pngs) >= 3
    imgs = [a["src"] for t, a in found if t == "img"]
    # every figure is embedded (the NSI report's markdown embeds its own figures a second time, in its text)
    assert sorted(set(base64.b64decode(s.split(",", 1)[1]) for s in imgs)) == sorted(set(p.read_bytes() for p in pngs))
    assert all(s.startswith("data:image/png;base64,") for s in imgs)
    assert [a["data-kind"] for t, a in found if t == "section"] == ["gap", "nsi", "results"]
    for csv in [p for d in (gap / "stats", nsi / "stats", cmp) for p in d.glob("*.csv")]:
        assert f"<summary>{csv.name} (" in html
    assert html.count("&quot;records_read&quot;") == 2  # both runs' manifests, escaped
    items = [a["id"] for t, a in found if t == "details" and a.get("class") == "item"]
    n_gap = pd.read_parquet(gap / "probes.parquet").scenario_id.nunique()
    assert len(items) == n_gap + min(14, DEFAULT_ITEMS)
    prompt = pd.read_parquet(gap / "probes.parquet")[PROMPT_TEXT].iloc[0]
    assert prompt.splitlines()[3] in html  # the drill-down holds the prompts ...
    assert "Judgment-action gap statistics" in html and "<table" in html  # ... and the stats report, rendered
    # self-contained: nothing to fetch, no script
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html) and "<script" not in html and "<link" not in html
    assert lines[-1].startswith(f"wrote {out} (3 sections, {len(pngs)} figures")


def test_text_is_escaped(folders, tmp_path):
    gap = tmp_path / "gap"
    shutil.copytree(folders[0], gap)
    path = gap / "probes.parquet"
    df = pd.read_parquet(path)
    j = df.index[df.readout == "J"][0]
    df.loc[j, "generated_text"] = "<script>alert('x')</script> & <b>bold</b>"
    df.to_parquet(path, index=False)
    out = tmp_path / "r.html"
    write_report([gap], out)
    html = out.read_text(encoding="utf-8")
    assert "<script>alert" not in html and "<b>bold" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in html
    assert "&lt;|im_start|&gt;system" in html  # the prompts' special tokens too


def test_command_line_default_out_notes_and_errors(folders, tmp_path, capsys):
    gap = tmp_path / "gap"
    shutil.copytree(folders[0], gap, ignore=shutil.ignore_patterns("stats"))
    code, out, err = cli(["report", str(gap), "--items", "1"], capsys)
    assert code == 0 and (gap / "report.html").is_file()
    assert f"warning: {gap}: no stats folder: run `readout stats {gap}` first" in out
    html = (gap / "report.html").read_text(encoding="utf-8")
    assert "no stats folder" in html and "<img" not in html and html.count('class="item"') == 1
    assert "the first 1 of 2 scenarios" in html
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = cli(["report", str(empty)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(empty) in err and "not a run directory" in err
    code, out, err = cli(["report", str(gap), str(folders[2])], capsys)
    assert code == 2 and "--out: required" in err


CHECK = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var bad = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  var pres = document.querySelectorAll("details.item pre");
  var shown = Array.prototype.filter.call(pres, function (p) { return p.getBoundingClientRect().height > 0; });
  var b = document.body;
  b.setAttribute("data-images", imgs.length);
  b.setAttribute("data-bad-images", bad.length);
  b.setAttribute("data-items", document.querySelectorAll("details.item").length);
  b.setAttribute("data-pres", pres.length);
  b.setAttribute("data-pres-shown", shown.length);
});
</script></body>"""


def chromium(html: str, tmp_path: Path, name: str) -> tuple[dict, str]:
    """Load `html` (with the check script) in headless Chromium: the body's data-* checks and the console lines."""
    page = tmp_path / f"{name}.html"
    page.write_text(html.replace("</body>", CHECK), encoding="utf-8")
    proc = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         f"--user-data-dir={tmp_path / (name + '-profile')}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = next(a for t, a in tags(proc.stdout) if t == "body")
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return body, "\n".join(console)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does as root)")
def test_page_renders_in_headless_chromium(page, tmp_path):
    html = page[0].read_text(encoding="utf-8")
    body, console = chromium(html, tmp_path, "report")
    assert console == ""
    assert int(body["data-images"]) >= 3 and body["data-bad-images"] == "0"
    assert int(body["data-items"]) == html.count('<details class="item"') > 2
    assert int(body["data-pres"]) > 0 and body["data-pres-shown"] == body["data-pres"]
    # The harness sees what it checks for: a console error, and a figure that does not decode.
    _, console = chromium(html.replace("<main>", "<main><script>console.error('planted')</script>", 1), tmp_path, "err")
    assert "planted" in console
    broken = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]{40}", "data:image/png;base64,AAAA", html, count=1)
    body, _ = chromium(broken, tmp_path, "broken")
    assert body["data-bad-images"] == "1"
