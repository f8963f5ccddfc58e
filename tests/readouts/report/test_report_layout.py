"""The report's page in headless Chromium at 1440 and 1024 px: a figure of two panels side by side (9 to 11 inches
at the figures' DPI) spans its row (in a half-row cell it would sit at about 40% of its size, its labels unreadable);
a command-line option in the card's prose ("a lower --mass-floor") is kept on one line (not broken between its two
dashes at a line end); counts read in the singular ("1 row"); and every table scrolls inside its own frame (wide
tables, the harness and NSI rankings, would be cut at the card's edge)."""

import re
import struct
import zlib
from html.parser import HTMLParser

from readouts.report.card import Card
from readouts.report.gather import Figure, Report, Section, TableData
from readouts.report.render import STYLE, card_html, figure_html, page, table_html
from readouts.show import DilemmaView, FramingView, ProbeView, PromptView, ScenarioView


def png(width: int, height: int) -> bytes:
    """A valid PNG header of the given size (the page reads the size from it)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))


def test_two_panel_figures_span_the_row():
    # the gap figures at DPI 130: control vs excess and the dose arm 9 in wide (1170 px), the slices 11 in (1430 px),
    # the scatter 6.2 in square (806 px), the NSI acquiescence 7.2 x 6.6 in (936 x 858 px)
    wide = {(1170, 676), (1170, 442), (1430, 754)}
    half = {(806, 780), (936, 858)}
    for w, h in wide | half:
        html = figure_html(Figure(f"f{w}x{h}.png", "", png(w, h)))
        assert ('class="wide"' in html) == ((w, h) in wide), (w, h)


def test_options_stay_on_one_line_in_the_card():
    card = Card("m on gap-v2", "E (L0) = n/a (n = 0)", [("settings", "not the paper's (rerun with --profile paper)")],
                "Nothing screened (a lower --mass-floor keeps more of them).")
    html = card_html(card)
    assert '<span class="opt">--mass-floor</span>' in html and '<span class="opt">--profile</span>' in html
    assert re.search(r"\.opt\{white-space:nowrap\}", STYLE)
    assert "--" not in re.sub(r'<span class="opt">--[a-z-]+</span>', "", html)  # every option wrapped


def test_counts_read_in_the_singular():
    html = table_html(TableData("screen.csv", ("a",), (("1",),), 1))
    assert "(1 row)" in html and "(1 rows)" not in html


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Tables(HTMLParser):
    """Every <table> of a page, named by its first header cell: its own classes and those of the elements around it."""

    def __init__(self):
        super().__init__()
        self.stack: list[set[str]] = []
        self.tables: list[dict] = []
        self.in_th = False

    def handle_starttag(self, tag, attrs):
        classes = set((dict(attrs).get("class") or "").split())
        if tag == "table":
            self.tables.append({"name": None, "own": classes, "around": set().union(*self.stack)})
        self.in_th = tag == "th" and self.tables and self.tables[-1]["name"] is None
        if tag not in VOID:
            self.stack.append(classes)

    def handle_data(self, data):
        if self.in_th:
            self.tables[-1]["name"] = data
            self.in_th = False

    def handle_endtag(self, tag):
        if tag not in VOID:
            self.stack.pop()


def css_rule(selector: str) -> str:
    m = re.search(r"(?:^|[}\n])" + re.escape(selector) + r"\{([^}]*)\}", STYLE)
    assert m, selector
    return m.group(1)


def test_every_table_scrolls_inside_its_own_frame():
    """A page with each kind of table the report draws: a run's CSV table 40 columns wide, a table of the stats
    report's markdown, a scenario's summary and option orders, a dilemma's replies. The CSV and markdown tables
    (the wide ones) and the option orders sit in a `.scroll` frame that scrolls both ways; the drill-down's other
    tables are themselves scrolling blocks (`table.data`); no table is left to overflow the card."""
    wide = TableData("nsi_rankings.csv", tuple(f"column_{k}" for k in range(40)), (tuple("0.5" for _ in range(40)),), 1)
    probe = ProbeView(rollout=-1, masses=(("A", 0.6), ("B", 0.3)), violating_letter="A", top_letter="A",
                      p_violating=0.66, letter_mass=0.9, anchor_rule=None, generated_text=None, generated_tokens=None)
    prompts = tuple(PromptView("primary", "D", "agent", k, (("A", "x"), ("B", "y")), "Which option?", (probe,))
                    for k in (0, 1))
    scenario = ScenarioView("run", "s1", {"family": "F1"}, ({"cell": "primary", "readout": "D", "frame": "agent",
                            "p_violating": 0.66, "violating_fraction": None, "judged_option": None, "letter_mass": 0.9},),
                            prompts)
    reply = {"sample": 0, "temperature": 0.7, "generated_tokens": 5, "truncated": False, "parse_ok": True,
             "decision": "agree", "endorse": 1, "parse_error": None, "text": "I agree."}
    dilemma = DilemmaView("run", "d1", {"domain": "medicine"}, (FramingView("F0", False, "They should X.", {}, (reply,)),))
    markdown = "# NSI\n\n| model | NSI |\n|---|---|\n| tiny | 0.5 |\n"
    sections = [Section("gap", "gap run", "run", tables=[wide], markdown=markdown, markdown_name="report.md",
                        items=[scenario], items_total=1),
                Section("nsi", "nsi run", "run", items=[dilemma], items_total=1)]
    parser = Tables()
    parser.feed(page(Report(sections, "now")))
    tables = {t["name"]: t for t in parser.tables}
    assert set(tables) == {"column_0", "model", "cell", "order", "reply"} and len(parser.tables) == 5
    for name in ("column_0", "model", "order"):  # the CSV, the markdown and the option orders' tables
        assert "scroll" in tables[name]["around"], name
    for t in parser.tables:  # the others (a scenario's summary, a dilemma's replies) are scrolling blocks themselves
        assert "scroll" in t["around"] or "data" in t["own"], t
    scroll = css_rule(".scroll")
    assert "overflow:auto" in scroll and "max-width:100%" in scroll
    data = css_rule("table.data")
    assert "display:block" in data and "overflow-x:auto" in data and "max-width:100%" in data
