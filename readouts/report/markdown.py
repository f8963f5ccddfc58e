"""The markdown the stats commands write (headings, paragraphs, `-` lists, pipe tables, `code`, **bold**) as HTML.

Only that subset: the reports are ours, and a markdown library would be one more dependency. Every piece of text
is escaped before the inline marks are turned into tags.
"""

from __future__ import annotations

import base64
import re
from html import escape

BULLET = re.compile(r"^\s*[-*]\s+")


def inline(text: str) -> str:
    """Escaped text with `code` and **bold** as tags."""
    out = escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?", line.strip()))


IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)\s]+)\)\s*$")


def to_html(text: str, shift: int = 2, images: dict[str, bytes] | None = None) -> str:
    """HTML of `text`; headings go `shift` levels down (a report's `#` title sits under the page's own headings).
    An image line `![alt](file.png)` embeds `images[file.png]` (a PNG beside the report); one not given is a note."""
    lines = text.splitlines()
    html, para, i = [], [], 0

    def flush():
        if para:
            html.append(f"<p>{inline(' '.join(para))}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        image = IMAGE.match(line.strip())
        if image:
            flush()
            png = (images or {}).get(image.group(2))
            html.append(f'<figure><img alt="{escape(image.group(1))}" src="data:image/png;base64,'
                        f'{base64.b64encode(png).decode()}"><figcaption>{escape(image.group(2))}</figcaption></figure>'
                        if png is not None else f'<p class="note">figure {escape(image.group(2))} is not in the folder</p>')
        elif heading:
            flush()
            level = min(6, len(heading.group(1)) + shift)
            html.append(f"<h{level}>{inline(heading.group(2))}</h{level}>")
        elif line.lstrip().startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            flush()
            head = "".join(f"<th>{inline(c)}</th>" for c in _cells(line))
            body, i = [], i + 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                body.append("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in _cells(lines[i])) + "</tr>")
                i += 1
            html.append(f'<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead>'
                        f'<tbody>{"".join(body)}</tbody></table></div>')
            continue
        elif BULLET.match(line):
            flush()
            items = []
            while i < len(lines) and BULLET.match(lines[i]):
                items.append("<li>" + inline(BULLET.sub("", lines[i])) + "</li>")
                i += 1
            html.append(f"<ul>{''.join(items)}</ul>")
            continue
        elif not line.strip():
            flush()
        else:
            para.append(line.strip())
        i += 1
    flush()
    return "\n".join(html)
