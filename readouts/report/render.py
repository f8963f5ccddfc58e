"""The report's data (readouts/report/gather.py) as one self-contained HTML page: styles inline, figures as base64
PNG, no script, nothing fetched. Every piece of text goes through `html.escape` (`e`).
"""

from __future__ import annotations

import base64
import json
import math
import re
from html import escape

from readouts.report.card import Card
from readouts.report.gather import Figure, Report, Section, TableData
from readouts.report.markdown import to_html
from readouts.show import DilemmaView, ProbeView, PromptView, ScenarioView, fmt, fmt_mass, plural


def e(x) -> str:
    return escape("" if x is None else str(x))


OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def prose(x) -> str:
    """Escaped prose with each command-line option (`--mass-floor`) kept on one line: the browser broke
    "--mass-floor" between its two dashes at the end of a line."""
    return OPTION.sub(lambda m: f'<span class="opt">{m.group(0)}</span>', e(x))


WIDE_PX = 1000
"""A figure wider than this (two panels side by side at the figures' DPI) spans the grid's row: in a half-row cell
it was shown at about 40% of its size, its 8-point labels unreadable."""


STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:16px 24px 64px}
header{background:#263238;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}header p{margin:4px 0 0;opacity:.8}
nav ul{padding-left:18px}section.run{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 20px 16px;margin:18px 0}
h2{font-size:18px;border-bottom:2px solid #263238;padding-bottom:4px}h3{font-size:16px;margin-top:22px}
h4,h5,h6{font-size:14px;margin:16px 0 6px}
.path{font-family:ui-monospace,Menlo,monospace;font-size:12px;color:#555}
.note{background:#fff6d6;border-left:4px solid #e0a800;padding:6px 10px;margin:8px 0}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:8px 0}dl.facts dt{color:#555}dl.facts dd{margin:0}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(440px,100%),1fr));gap:14px;align-items:start}
figure{margin:0;border:1px solid #e3e3e3;border-radius:4px;padding:6px;background:#fff}
figure img{width:100%;height:auto;max-height:560px;object-fit:contain;display:block}
figure.wide{grid-column:1/-1}figcaption{font-size:12px;color:#444;margin-top:4px}
table.data{border-collapse:collapse;font-size:12px;margin:6px 0;display:block;overflow-x:auto;max-width:100%}
table.data th,table.data td{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top;white-space:nowrap}
table.data th{background:#eef1f3;position:sticky;top:0}table.data td.text{white-space:normal;min-width:260px}
details{margin:4px 0}details>summary{cursor:pointer;padding:2px 0}details.item{border:1px solid #ddd;border-radius:4px;
padding:4px 10px;margin:6px 0;background:#fff}details.item>summary{font-weight:600}details.group{margin-left:8px}
pre{white-space:pre-wrap;word-break:break-word;background:#f4f5f7;border:1px solid #e1e4e8;padding:8px;margin:4px 0;
font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;max-height:480px;overflow:auto}
.prompt{border-left:3px solid #90a4ae;padding-left:10px;margin:10px 0}.order{font-size:12px;color:#333}
.m{display:inline-block;font:12px ui-monospace,Menlo,monospace;margin-right:8px}.m.v{color:#b71c1c;font-weight:700}
.bar{display:inline-flex;width:120px;height:10px;background:#eceff1;vertical-align:middle;margin-right:6px}
.bar span{display:block;height:100%;background:#90a4ae;border-right:1px solid #fff}.bar span.v{background:#d32f2f}
code{background:#f1f1f1;padding:0 3px;border-radius:3px}
.card{border:2px solid #263238;border-radius:8px;padding:12px 16px;margin:12px 0;background:#f5f8fa}
.card-title{font-size:13px;color:#455a64}.estimate{font-size:22px;font-weight:700;margin:4px 0 8px}
.card .meaning{font-size:15px;margin:8px 0 0}.count{color:#777;font-size:12px}
details.warnings{background:#fffaf0;border:1px solid #f0d9a8;border-radius:4px;padding:4px 10px}
details.warnings ul{margin:4px 0;padding-left:18px}
.scroll{overflow:auto;max-width:100%;max-height:520px;border:1px solid #eee;margin:4px 0 10px}.scroll table.data{margin:0}
.orders td{font-size:12px}.opt{white-space:nowrap}
"""


def page(report: Report) -> str:
    nav = "".join(f'<li><a href="#s{k}">{e(s.title)}</a></li>' for k, s in enumerate(report.sections, 1))
    body = "\n".join(section_html(s, f"s{k}") for k, s in enumerate(report.sections, 1))
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><title>logit-readout report</title>'
            f"<style>{STYLE}</style></head><body>\n<header><h1>logit-readout report</h1>"
            f"<p>{len(report.sections)} folder(s), written {e(report.created)}</p></header>\n<main>"
            f"<nav><ul>{nav}</ul></nav>\n{body}\n</main></body></html>\n")


def section_html(s: Section, sid: str) -> str:
    """The answer first: the headline card and the grouped warnings, then figures, tables, the statistics report,
    the run's facts and manifest, and the drill-down."""
    parts = [f'<section class="run" id="{sid}" data-kind="{e(s.kind)}"><h2>{e(s.title)}</h2>',
             f'<div class="path">{e(s.path)}</div>']
    if s.card is not None:
        parts.append(card_html(s.card))
    parts += [f'<div class="note">{prose(n)}</div>' for n in s.notes]
    if s.warnings:
        items = "".join(f"<li>{prose(line)}{f' <span class=count>({n} lines of this kind)</span>' if n > 1 else ''}</li>"
                        for line, n in s.warnings)
        parts.append(f'<details class="warnings" open><summary>{len(s.warnings)} kinds of warnings and notes'
                     f"</summary><ul>{items}</ul></details>")
    parts.append(local_nav(s, sid))
    if s.figures:
        figures = "".join(figure_html(f) for f in s.figures)
        parts.append(f'<h3 id="{sid}-figures">Figures</h3><div class="figs">{figures}</div>')
    if s.tables:
        parts.append(f'<h3 id="{sid}-tables">Tables</h3>' + "".join(table_html(t) for t in s.tables))
    if s.markdown is not None:
        images = {f.name: f.png for f in s.figures}
        parts.append(f'<h3 id="{sid}-report">Statistics report <span class="path">{e(s.markdown_name)}</span></h3>'
                     f'<details class="md"><summary>the full report as the stats command wrote it</summary>'
                     f"{to_html(s.markdown, images=images)}</details>")
    if s.facts or s.manifest:
        facts = ('<dl class="facts">' + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in s.facts) + "</dl>"
                 if s.facts else "")
        manifest = (f"<details><summary>manifest.json</summary>"
                    f"<pre>{e(json.dumps(s.manifest, indent=2, sort_keys=True, default=str))}</pre></details>"
                    if s.manifest else "")
        parts.append(f'<h3 id="{sid}-manifest">Run facts</h3>{facts}{manifest}')
    if s.items:
        what = "scenarios" if s.kind == "gap" else "dilemmas"
        shown = (("the one " + what[:-1] if s.items_total == 1 else f"all {s.items_total} {what}") if len(s.items) == s.items_total else
                 f"the first {len(s.items)} of {s.items_total} {what} (<code>readout report --items N</code> shows more; "
                 f"<code>readout show {e(s.path)} ID</code> prints any one)")
        body = ("each distinct prompt once, its option orders and rollouts as rows, with read rules and letter masses"
                if s.kind == "gap" else "per framing, the continuous reading and every reply")
        parts.append(f'<h3 id="{sid}-items">Per {what[:-1]}</h3><p>Drill-down over {shown}: {body}.</p>')
        parts += [item_html(v, f"{sid}-i{k}") for k, v in enumerate(s.items, 1)]
    parts.append("</section>")
    return "\n".join(parts)


def card_html(c: Card) -> str:
    facts = "".join(f"<dt>{e(k)}</dt><dd>{prose(v)}</dd>" for k, v in c.facts)
    return (f'<div class="card"><div class="card-title">{e(c.title)}</div><div class="estimate">{e(c.estimate)}</div>'
            f'<dl class="facts">{facts}</dl>' + (f'<p class="meaning">{prose(c.meaning)}</p>' if c.meaning else "") + "</div>")


def png_size(png: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's header, or None when the bytes are not a PNG."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def figure_html(f: Figure) -> str:
    """A figure embedded as base64 PNG; a wide one (more than WIDE_PX pixels, or twice as wide as high) spans the
    grid's row."""
    size = png_size(f.png)
    wide = ' class="wide"' if size and size[1] and (size[0] > WIDE_PX or size[0] / size[1] > 2) else ""
    caption = f"{e(f.caption)} " if f.caption else ""
    return (f'<figure{wide}><img alt="{e(f.name)}" src="data:image/png;base64,{base64.b64encode(f.png).decode()}">'
            f'<figcaption>{caption}<span class="path">{e(f.name)}</span></figcaption></figure>')


def local_nav(s: Section, sid: str) -> str:
    """Links to the section's parts that are there (the drill-down sits below long tables)."""
    parts = [("figures", "Figures", s.figures), ("tables", "Tables", s.tables),
             ("report", "Statistics report", s.markdown is not None), ("manifest", "Run facts", s.facts or s.manifest),
             ("items", "Drill-down", s.items)]
    links = " · ".join(f'<a href="#{sid}-{key}">{label}</a>' for key, label, there in parts if there)
    return f'<p class="local">{links}</p>' if links else ""


def table_html(t: TableData) -> str:
    if t.error is not None:
        return f'<div class="note unreadable">{e(t.name)}: not a readable CSV table ({e(t.error)})</div>'
    more = f" (first {len(t.rows)} of {t.total_rows} rows)" if t.total_rows > len(t.rows) else f" ({plural(t.total_rows, 'row')})"
    head = "".join(f"<th>{e(c)}</th>" for c in t.columns)
    rows = "".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in r) + "</tr>" for r in t.rows)
    return (f'<details class="table"><summary>{e(t.name)}{e(more)}</summary>'
            f'<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'
            "</details>")


def item_html(v: ScenarioView | DilemmaView, iid: str) -> str:
    return scenario_html(v, iid) if isinstance(v, ScenarioView) else dilemma_html(v, iid)


def masses_html(p: ProbeView) -> str:
    """A bar of the letters' shares (violating in red) and each letter's full-softmax mass."""
    total = sum(m for _, m in p.masses)
    bar = "".join(f'<span class="{"v" if letter == p.violating_letter else "o"}" style="width:{100 * m / total:.1f}%" '
                  f'title="{e(letter)} {m / total:.3f}"></span>' for letter, m in p.masses) if total > 0 else ""
    chips = "".join(f'<span class="m{" v" if letter == p.violating_letter else ""}">{e(letter)} {e(fmt_mass(m))}</span>'
                    for letter, m in p.masses)
    drawn = f'<span class="m">drawn {e(p.drawn)}</span>' if p.drawn else ""
    return f'<span class="bar">{bar}</span>{chips}{drawn}'


def prompt_html(prs: list[PromptView]) -> str:
    """One distinct prompt, shown once, with every option order and rollout that read it as rows."""
    pr = prs[0]
    text = (f"<details><summary>prompt ({len(pr.prompt_text)} characters)</summary><pre>{e(pr.prompt_text)}</pre></details>"
            if pr.prompt_text is not None else
            '<div class="note">prompt not stored: this run predates probes.parquet\'s prompt_text '
            "(`readout panels show` renders it)</div>")
    rows = []
    for view in prs:
        order = " ".join(f"{letter}={opt}" for letter, opt in view.options)
        for p in view.probes:
            gen = (f"<details><summary>{e(p.generated_tokens)} tokens</summary><pre>{e(p.generated_text)}</pre></details>"
                   if p.generated_text is not None else "")
            rows.append(f"<tr><td>{view.order_index}</td><td>{e(order)}</td><td>{p.rollout}</td>"
                        f"<td>{e(p.anchor_rule or 'first token')}</td><td>{masses_html(p)}</td>"
                        f"<td>{e(fmt_mass(p.letter_mass))}</td><td>{e(p.top_letter)}</td><td>{e(fmt(p.p_violating))}</td>"
                        f'<td class="text">{gen}</td></tr>')
    frames = ", ".join(dict.fromkeys(v.frame for v in prs))
    return (f'<div class="prompt"><div class="order"><strong>{e(frames)}</strong>: {plural(len(prs), "option order")}'
            f"</div>{text}<div class=\"scroll\"><table class=\"data orders\"><thead><tr><th>order</th><th>letters</th>"
            "<th>rollout</th><th>read rule</th><th>letter masses (violating in red)</th><th>letter mass</th><th>top</th>"
            f"<th>p_violating</th><th>generated text</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div></div>")


def distinct_prompts(prs: list[PromptView]) -> list[list[PromptView]]:
    """The prompt views grouped by prompt text (in first-seen order); a view without stored text stands alone."""
    groups: dict = {}
    for k, pr in enumerate(prs):
        groups.setdefault(pr.prompt_text if pr.prompt_text is not None else ("", k), []).append(pr)
    return list(groups.values())


def scenario_html(v: ScenarioView, iid: str) -> str:
    facts = ", ".join(f"{k} {v.facts[k]}" for k in ("family", "domain", "violating") if k in v.facts)
    summary = "".join(
        f"<tr><td>{e(s['cell'])}</td><td>{e(s['readout'])}</td><td>{e(s['frame'])}</td><td>{e(fmt(s['p_violating']))}</td>"
        f"<td>{e(fmt(s['violating_fraction']))}</td><td>{e(s['judged_option'] or '')}</td><td>{e(fmt(s['letter_mass'], 4))}</td></tr>"
        for s in v.summary)
    groups: dict[tuple[str, str], list[PromptView]] = {}
    for pr in v.prompts:
        groups.setdefault((pr.cell, pr.readout), []).append(pr)
    blocks = "".join(
        f'<details class="group"><summary>{e(cell)} / {e(readout)}: {plural(len(distinct_prompts(prs)), "distinct prompt")}'
        f", {plural(len(prs), 'option order')}, {plural(sum(len(p.probes) for p in prs), 'read')}</summary>"
        f"{''.join(prompt_html(g) for g in distinct_prompts(prs))}</details>"
        for (cell, readout), prs in groups.items())
    return (f'<details class="item" id="{iid}"><summary>{e(v.scenario_id)} <span class="path">{e(facts)}</span></summary>'
            '<table class="data"><thead><tr><th>cell</th><th>readout</th><th>frame</th><th>p_violating</th>'
            f"<th>violating fraction</th><th>judged option</th><th>letter mass</th></tr></thead><tbody>{summary}</tbody>"
            f"</table>{blocks}</details>")


def dilemma_html(v: DilemmaView, iid: str) -> str:
    parts = [f'<details class="item" id="{iid}"><summary>{e(v.dilemma_id)} '
             f'<span class="path">{e(v.facts.get("domain", ""))}</span></summary>']
    parts += [f'<div class="note">{e(n)}</div>' for n in v.notes]
    for f in v.framings:
        reading = ", ".join(f"{k} {fmt(x, 4)}" for k, x in f.continuous.items() if not math.isnan(x))
        message = (f"<details><summary>message (before the chat template)</summary><pre>{e(f.message)}</pre></details>"
                   if f.message is not None else "")
        rows = "".join(
            f"<tr><td>{r['sample']}</td><td>{r['temperature']:g}</td><td>{r['generated_tokens']}"
            f"{' (truncated)' if r['truncated'] else ''}</td><td>"
            f"{e(('decision ' + str(r['decision']) + ', endorse ' + str(r['endorse'])) if r['parse_ok'] else 'unparsed: ' + str(r['parse_error']))}"
            f'</td><td class="text"><pre>{e(r["text"])}</pre></td></tr>' for r in f.replies)
        parts.append(f'<details class="group"><summary>{e(f.framing)} ({"negated" if f.negated else "plain"}): '
                     f"{len(f.replies)} replies; {e(reading)}</summary>{message}"
                     '<table class="data"><thead><tr><th>reply</th><th>T</th><th>tokens</th><th>outcome</th><th>text</th>'
                     f"</tr></thead><tbody>{rows}</tbody></table></details>")
    parts.append("</details>")
    return "".join(parts)

