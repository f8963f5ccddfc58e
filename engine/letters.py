"""Option letters as tokens: each letter is read as the sum of its single-token variants.

"A" and " A" must each be exactly one token (the bare letter follows a chat generation prompt, the
spaced one follows "Answer:"); "\nA" is added where the vocabulary has it as one token. All variant
ids must be distinct across letters, or the readout would count one token for two options.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import LetterTokenError

REQUIRED = ("{L}", " {L}")
OPTIONAL = ("\n{L}",)


@dataclass(frozen=True)
class LetterTokens:
    """The token ids read for each letter, and their decoded text (for the manifest)."""

    letters: tuple[str, ...]
    """The letters, in the caller's order."""
    token_ids: tuple[tuple[int, ...], ...]
    """Per letter, the ids of its single-token variants."""
    decoded: tuple[tuple[str, ...], ...]
    """Per letter, each variant id decoded back to text."""

    def as_manifest(self) -> dict:
        return {
            letter: [{"id": i, "text": t} for i, t in zip(ids, texts)]
            for letter, ids, texts in zip(self.letters, self.token_ids, self.decoded)
        }


def _single(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def resolve_letters(tokenizer, letters) -> LetterTokens:
    """Validate and resolve `letters`; LetterTokenError naming the offending letter otherwise."""
    letters = tuple(letters)
    if len(letters) < 2:
        raise LetterTokenError(f"letters: need at least 2, got {list(letters)}")
    if len(set(letters)) != len(letters):
        raise LetterTokenError(f"letters: {list(letters)} repeats a letter")
    owner: dict[int, str] = {}
    all_ids, all_text = [], []
    for letter in letters:
        if not isinstance(letter, str) or not letter.strip() or letter != letter.strip():
            raise LetterTokenError(f"letter {letter!r}: must be a non-empty string without surrounding spaces")
        ids = []
        for pattern in REQUIRED + OPTIONAL:
            variant = pattern.format(L=letter)
            tid = _single(tokenizer, variant)
            if tid is None:
                if pattern in REQUIRED:
                    pieces = tokenizer.encode(variant, add_special_tokens=False)
                    raise LetterTokenError(
                        f"letter {letter!r}: variant {variant!r} is {len(pieces)} tokens {pieces} in this tokenizer, not one"
                    )
                continue
            if tid in owner and owner[tid] != letter:
                raise LetterTokenError(f"letter {letter!r}: variant {variant!r} is token {tid}, already read for letter {owner[tid]!r}")
            if tid not in ids:
                owner[tid] = letter
                ids.append(tid)
        all_ids.append(tuple(ids))
        all_text.append(tuple(tokenizer.decode([i]) for i in ids))
    return LetterTokens(letters=letters, token_ids=tuple(all_ids), decoded=tuple(all_text))


def word_start_tokens(tokenizer, words) -> LetterTokens:
    """Tokens that can start each word, for reading a word's mass at the next token.

    A token counts for a word when its text is a non-empty prefix of the word ("ag" for "agree"), or is the
    word followed by a non-letter ('agree"'). Special tokens never count. The sets must be disjoint.
    """
    words = tuple(words)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    sets = {w: [] for w in words}
    for tid in range(len(tokenizer)):
        if tid in special:
            continue
        text = tokenizer.decode([tid])
        if not text or "\ufffd" in text:
            continue
        for w in words:
            if w.startswith(text) or (text.startswith(w) and not text[len(w):][:1].isalpha()):
                sets[w].append(tid)
    owner = {}
    for w in words:
        if not sets[w]:
            raise LetterTokenError(f"word {w!r}: no token in this vocabulary starts it")
        for tid in sets[w]:
            if tid in owner:
                raise LetterTokenError(f"word {w!r}: token {tid} also starts {owner[tid]!r}")
            owner[tid] = w
    return LetterTokens(
        letters=words, token_ids=tuple(tuple(sets[w]) for w in words),
        decoded=tuple(tuple(tokenizer.decode([t]) for t in sets[w]) for w in words),
    )
