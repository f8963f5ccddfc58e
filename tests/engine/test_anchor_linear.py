"""The anchor read's token search (binary searches over decoded prefix lengths) equals a plain token-by-token
scan, on rollouts built to be awkward: random token ids (byte pieces of split characters
included) with an anchor, or a variant of one, spliced in at token boundaries that need not be the
tokenizer's own; where the token-by-token scan keeps tokens whose text is not a prefix of the rollout's (a split
character), the read is the one that decodes to the text through the anchor."""

import random

import pytest

from engine.anchor import anchor_read, find_anchor
from engine.generation import Rollout
from tests.helpers import SMOLLM2, TINY, get_model

ANCHORS = ["Answer: B", "**Answer:** A", "Final answer: B", "answer - C", "\nAnswer:B", "Answer: (A)", "ANSWER: **B**"]
FILL = ["Weighing it, ", "café déjà vu — ", "数字 ", "🙂 fine. ", "the client, ", "x"]


def _token_scan(tokenizer, toks, pos, target):
    """The scan anchor_read used before: one decode per token up to the anchor, then per token after."""
    m = 0
    while m < len(toks) and len(tokenizer.decode(toks[: m + 1])) <= pos:
        m += 1
    head = tokenizer.decode(toks[:m])
    k = next((k for k in range(m + 1, len(toks) + 1) if tokenizer.decode(toks[:k]) == target), None)
    return k, (toks[:k] if k is not None else toks[:m] + tokenizer.encode(target[len(head):], add_special_tokens=False))


def _rollouts(tok, rng, count):
    vocab = tok.vocab_size
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    for i in range(count):
        before = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))] + enc(rng.choice(FILL))
        anchor, fill = rng.choice(ANCHORS), rng.choice(FILL)
        if i % 3 == 0:  # the anchor's tokens split at a character the tokenizer would not split at
            cut = rng.randrange(1, len(anchor))
            middle = enc(anchor[:cut]) + enc(anchor[cut:] + fill)
        elif i % 3 == 1:  # the anchor's last token runs on into the text after it
            middle = enc(anchor.rstrip("AB C()*") + rng.choice(["-)", ":", "Bx", "—", ".."]) + fill)
        else:
            middle = enc(anchor) + enc(fill)
        yield before + middle + [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]


@pytest.mark.parametrize("name", [*TINY, SMOLLM2])
def test_search_equals_the_scan_it_replaced(name):
    lm = get_model(name)
    tok, rng = lm.tokenizer, random.Random(7)
    seen = differ = 0
    for toks in _rollouts(tok, rng, 240):
        text = tok.decode(toks)
        hit = find_anchor(text)
        if hit is None:
            continue
        seen += 1
        _, pos, end, _ = hit
        target = text[:end]
        read = anchor_read(tok, [9], Rollout(tuple(toks), True, False))
        k, kept = _token_scan(tok, toks, pos, target)
        if list(read.ids[1:]) != kept:
            differ += 1  # only where the scan's kept text was not the text through the anchor
            assert tok.decode(kept) != target and tok.decode(list(read.ids[1:])) == target
        if k is not None:  # the scan found the model's own tokens ending at the anchor: the same count
            assert read.kept_tokens == k
    assert seen >= 150 and differ <= seen // 20


class _SplitCharTokenizer:
    """Pieces as tokens; "é" may come as two pieces, the second one running on into "Ans". A prefix that
    ends inside the character decodes with U+FFFD, as byte-level tokenizers do."""

    PIECES = ["x", "<e1>", "<e2>Ans", "wer", ":B", " it", "é", "Answer", ":", " B"]

    def decode(self, ids):
        text = "".join(self.PIECES[i] for i in ids).replace("<e1><e2>", "é")
        return text.replace("<e1>", "\ufffd").replace("<e2>", "\ufffd")

    def encode(self, text, add_special_tokens=False):
        out = []
        while text:  # longest piece first
            i = max((i for i, p in enumerate(self.PIECES) if "<" not in p and text.startswith(p)),
                    key=lambda i: len(self.PIECES[i]))
            out.append(i)
            text = text[len(self.PIECES[i]):]
        return out


def test_a_character_split_before_the_anchor_is_not_kept_half():
    tok = _SplitCharTokenizer()
    toks = [0, 1, 2, 3, 4, 5]  # "xéAnswer:B it": the anchor starts inside token 2, ':' runs on into 'B'
    read = anchor_read(tok, [], Rollout(tuple(toks), True, False))
    assert read.rule == "own" and read.text == "xéAnswer:"
    assert tok.decode(list(read.ids)) == "xéAnswer:"  # not "x\ufffdAnswer:" (the scan keeps token 1)
    assert read.kept_tokens == 1
