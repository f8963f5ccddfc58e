"""What the report's page looked like in headless Chromium at 1440 and 1024 px (issue 30): a figure of two panels
side by side (9 to 11 inches at the figures' DPI) sat in a half-row cell at about 40% of its size, its labels
unreadable, so it spans the row; a command-line option in the card's prose ("a lower --mass-floor") broke between
its two dashes at a line end, so options are kept on one line; and counts read in the singular ("1 row")."""

import re
import struct
import zlib

from readouts.report.card import Card
from readouts.report.gather import Figure, TableData
from readouts.report.render import STYLE, card_html, figure_html, table_html


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
