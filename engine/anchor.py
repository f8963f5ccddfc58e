"""The anchor rule: where a generated text is read ("Answer:" then the letter). The model's own anchor, or
one of its common formatting variants followed by the answer, is read where it stands; otherwise the answer is
forced after the text (engine.generation makes the rollouts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from engine.generation import Rollout

ANCHOR_RULES = ("own", "own_bold", "own_final", "own_dash", "own_case", "forced_after_completion", "forced_at_budget")
"""The base rules an anchor read is labelled with (variants may carry `+wrapped` and `+tool:<letter>`)."""


@dataclass(frozen=True)
class AnchorRead:
    """Where a generated text is read: the token ids to score (the letter comes next) and how they were made."""

    ids: tuple[int, ...]
    rule: str
    """own | own_<variant> (own_bold, own_final, own_dash, own_case), each with `+wrapped` when the letter
    sits in `**B**`, `(B)` or `[B]` and `+tool:<letter>` when a tool's name stands where the letter
    would; or forced_after_completion | forced_at_budget."""
    kept_tokens: int
    """Generated tokens kept before the anchor."""
    text: str
    """The generated text that precedes the read position (anchor included)."""


# Variants of the anchor a model writes in place of the literal one, most specific first (a tie on the
# start position goes to the earlier rule). Each must be followed by the answer (a letter or a tool name).
_VARIANTS = (
    ("own_bold", r"\*\*[ \t]*(?:final[ \t]+)?answer[ \t]*:?[ \t]*\*\*(?:[ \t]*:)?"),  # **Answer:** / **Answer**: B
    ("own_final", r"final[ \t]+answer[ \t]*(?:[:\-\u2013\u2014]|is\b)"),  # Final answer: B / final answer is B
    ("own_dash", r"answer[ \t]*[\-\u2013\u2014]"),  # Answer - B
    ("own_case", r"answer[ \t]*:"),  # ANSWER: B, answer : B
)
_WRAP = r"[ \t]*(?:\*\*|\*|\(|\[)"


def find_anchor(text: str, anchor: str = "Answer:", letters: str = "ABCDE",
                names: dict[str, str] | None = None) -> tuple[str, int, int, str | None] | None:
    """The first anchor in `text`: (rule, its start, the end of the read prefix, the letter a tool name
    names or None).

    The literal anchor (rule `own`) counts wherever it is, as it always has; a variant counts only when
    the answer follows it. Where the letter is wrapped (`**B**`, `(B)`), the read prefix takes the opening
    wrapper so the letter is the next token. `names` maps F3 tool names to their letters: a tool named
    where the letter would be is labelled `+tool:<letter>` (the read position stays right after the anchor).
    """
    names = {k.lower(): v for k, v in (names or {}).items()}
    answer = "|".join([rf"[{re.escape(letters)}](?![A-Za-z0-9_])"] + [re.escape(n) for n in names])
    follows = rf"(?=(?:{_WRAP})?[ \t`]*(?:{answer}))"
    found = []
    for order, (rule, pattern) in enumerate((("own", re.escape(anchor)),) + _VARIANTS):
        flags = 0 if rule == "own" else re.IGNORECASE
        m = re.search(pattern if rule == "own" else pattern + follows, text, flags)
        if m:
            found.append((m.start(), -(m.end() - m.start()), order, rule, m.end()))
    if not found:
        return None
    start, _, _, rule, end = min(found)
    wrap = re.match(rf"{_WRAP}[ \t]*(?=[{re.escape(letters)}](?![A-Za-z0-9_]))", text[end:])
    if wrap:
        rule, end = rule + "+wrapped", end + wrap.end()
    tool = re.match(rf"[ \t`*]*({'|'.join(re.escape(n) for n in names)})(?![A-Za-z0-9_])", text[end:],
                    re.IGNORECASE) if names else None
    named = names[tool.group(1).lower()] if tool else None
    return (rule + f"+tool:{named}" if named else rule), start, end, named


def _first(lo: int, hi: int, pred) -> int:
    """The first i in [lo, hi) with pred(i) true (pred false, then true), else hi: a binary search."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _anchor_tokens(tokenizer, toks: list[int], text: str, pos: int, target: str) -> tuple[int, int | None]:
    """(m, k): the generated tokens whose text ends at or before the anchor's start `pos` (m of them), and
    the count k of tokens whose text is exactly `target` (the text through the anchor), or None.

    Binary searches over decoded prefix lengths, O(log n) decodes instead of one per token (the prefix
    lengths grow with the token count; where a prefix's text is not a prefix of the full text, e.g. a
    character split across tokens decoding as U+FFFD, m steps back to one that is, so the kept tokens
    plus the re-encoded rest decode to `target`). k is the first prefix as long as `target`, kept when its
    text is `target`. Equal to the token-by-token scan it replaced on the tests' rollouts
    (tests/engine/test_anchor_linear.py)."""
    length = lambda i: len(tokenizer.decode(toks[:i]))  # noqa: E731
    m = _first(0, len(toks), lambda i: length(i + 1) > pos)
    while m > 0 and not text.startswith(tokenizer.decode(toks[:m])):
        m -= 1
    k = _first(m + 1, len(toks) + 1, lambda i: length(i) >= len(target))
    return m, (k if k <= len(toks) and tokenizer.decode(toks[:k]) == target else None)


def anchor_read(tokenizer, prompt_ids: Sequence[int], rollout: Rollout, anchor: str = "Answer:", cut: int | None = None,
                letters: str = "ABCDE", names: dict[str, str] | None = None) -> AnchorRead:
    """The read position after the anchor for one rollout.

    If the model wrote the anchor itself, or one of its variants followed by the answer (`find_anchor`),
    the text is cut right after it (rule `own` or `own_<variant>`), keeping the model's own tokens when
    they end exactly there. Otherwise a newline and the anchor are appended after the full text
    (`forced_after_completion`, the model ended its turn) or after the text cut at the budget
    (`forced_at_budget`, also when `cut` truncates the rollout on purpose).
    """
    toks = list(rollout.tokens if cut is None else rollout.tokens[:cut])
    truncated = cut is not None and cut < len(rollout.tokens)
    text = tokenizer.decode(toks)
    hit = find_anchor(text, anchor, letters, names)
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    if hit is not None:
        rule, pos, end, _ = hit
        target = text[:end]
        m, k = _anchor_tokens(tokenizer, toks, text, pos, target)
        kept = toks[:k] if k is not None else toks[:m] + encode(target[len(tokenizer.decode(toks[:m])):])
        return AnchorRead(tuple(prompt_ids) + tuple(kept), rule, k if k is not None else m, target)
    rule = "forced_at_budget" if (truncated or not rollout.stopped) else "forced_after_completion"
    suffix = "\n" + anchor
    return AnchorRead(tuple(prompt_ids) + tuple(toks) + tuple(encode(suffix)), rule, len(toks), text + suffix)
