"""A served model: any OpenAI-compatible chat endpoint (a commercial API, vLLM, SGLang, the llama.cpp server)
as an engine-level model that generates text and returns top-k logprobs. It knows nothing of panels.

What is exact and what is bounded. A reply's text is what the server sampled (its own sampler, seeded by
the request's `seed` where the server honours it). The mass on a set of tokens at a read position is read
from the server's top-k logprobs there: a token in the top k is read exactly (up to the server's own
numerics); a token outside it holds at most min(p_k, unseen), where p_k is the k-th probability and
`unseen` = 1 - (mass of the top k). A letter none of whose forms is in the top k is never read as zero:
its mass is NaN and the row says which letters fell outside. A position whose logprobs no softmax gives (a NaN,
a value above 0, or every one null: the model's logits were NaN or infinite) is refused, never read
(`unreadable_position`).

A read position after given text (the continuous NSI read after '{"decision": "', a forced "Answer:") is a
request whose last message is the assistant's own text, which the server continues (assistant prefill:
vLLM and SGLang with `continue_final_message` (PREFILL_FIELDS), the llama.cpp server, Anthropic-style APIs).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Sequence

from engine.errors import NonFiniteLogitsError
from engine.served_client import Client, ClientSettings, ReplyCache, ServedError

PREFIX = "openai:"
PREFILL_FIELDS = {"continue_final_message": True, "add_generation_prompt": False}
"""Sent with a read after given text: vLLM and SGLang continue the final assistant message only when asked
(else they open a new assistant turn after it); the llama.cpp server continues it by itself and ignores them."""
READ_FORMS = ("{L}", " {L}", "\n{L}")
"""The text forms a letter is read in at a served read position (engine/letters.py's variants, by text)."""


@dataclass(frozen=True)
class ServedSpec:
    """Where the model is served and how to talk to it (from `--model openai:NAME@URL` or `--endpoint`)."""

    name: str
    """The model name the endpoint is asked for (the request's `model`)."""
    url: str
    """Base URL of the OpenAI-compatible API, e.g. http://127.0.0.1:8080/v1."""
    key_env: str | None = None
    """Environment variable holding the API key (its value is never recorded)."""
    top_logprobs: int = 20
    """Top-k logprobs asked for at read positions (OpenAI allows up to 20; vLLM's default cap is 20)."""
    cache: str | None = None
    """Folder of the request cache (None: <cache root>/served)."""
    client: ClientSettings = field(default_factory=ClientSettings)


def parse_served(model: str, endpoint: str | None) -> tuple[str, str] | None:
    """(name, url) when `model` is `openai:NAME@URL`, or `endpoint` is given; None for a local model."""
    if model.startswith(PREFIX):
        if endpoint is not None:
            raise ServedError(f"--endpoint: the model '{model}' already names its endpoint")
        name, sep, url = model[len(PREFIX):].rpartition("@")
        if not sep or not name or not re.match(r"https?://", url):
            raise ServedError(f"--model: '{model}' must look like openai:NAME@http://host:port/v1")
        return name, url
    if endpoint is not None:
        if not re.match(r"https?://", endpoint):
            raise ServedError(f"--endpoint: '{endpoint}' must start with http:// or https://")
        return model, endpoint
    return None


@dataclass(frozen=True)
class Token:
    """One generated token with the top-k alternatives the server gave at its position."""

    text: str
    top: tuple[tuple[str, float], ...]
    """(token text, probability), most likely first; empty when the server returned no logprobs."""


@dataclass(frozen=True)
class Reply:
    """One chat completion."""

    text: str
    finish_reason: str | None
    completion_tokens: int | None
    prompt_tokens: int | None
    tokens: tuple[Token, ...]
    served_id: str | None
    fingerprint: str | None


LOGPROB_ROUNDING = 1e-3
"""How far above 0 a logprob the server sends may stand and still be read as a probability (rounding near p = 1)."""


def _readable(logprob) -> bool:
    """Whether a logprob the server sent is a number a probability can be read from: not null, not NaN, not above 0
    beyond rounding (+inf included); -inf is a probability of 0. A JSON integer is never NaN and is compared exactly,
    however many digits it has (one past a float's range raises nothing here)."""
    return (isinstance(logprob, (int, float)) and not isinstance(logprob, bool)
            and (isinstance(logprob, int) or not math.isnan(logprob)) and logprob <= LOGPROB_ROUNDING)


LOGPROB_FLOOR = -1e4
"""Below this a logprob is a probability of exactly 0 in float64 (exp underflows past about -745); clamping to it
first keeps a JSON integer too large for a float from overflowing the conversion."""


def _positions(raw: dict) -> list:
    """The logprobs entries of a raw reply's first choice, one per generated token."""
    choice = (raw.get("choices") or [{}])[0]
    return (choice.get("logprobs") or {}).get("content") or []


def unreadable_position(raw: dict) -> int | None:
    """The first generated token at which the logprobs the server sent (the token's own and its top-k
    alternatives') cannot come from a softmax, or None: one of them is NaN, above 0 or not a number, or every one is
    null. Logits with a NaN or an infinity make the whole softmax NaN, which vLLM sends as null (JSON has no NaN) and
    other servers as NaN; a null beside a readable number is a token of probability 0 (the llama.cpp server writes
    log 0 as null) and is left out of the top k."""
    for i, t in enumerate(_positions(raw)):
        sent = [a["logprob"] for a in (t.get("top_logprobs") or []) if "logprob" in a]
        if "logprob" in t:
            sent.append(t["logprob"])
        given = [x for x in sent if x is not None]
        if (sent and not given) or not all(_readable(x) for x in given):
            return i
    return None


def _reply(raw: dict) -> Reply:
    choice = (raw.get("choices") or [{}])[0]
    content = (choice.get("message") or {}).get("content")
    tokens = []
    for t in _positions(raw):
        top = tuple((str(a.get("token", "")), math.exp(max(a["logprob"], LOGPROB_FLOOR)))
                    for a in (t.get("top_logprobs") or []) if _readable(a.get("logprob")))
        tokens.append(Token(str(t.get("token", "")), tuple(sorted(top, key=lambda x: -x[1]))))
    usage = raw.get("usage") or {}
    return Reply(text=content if isinstance(content, str) else "", finish_reason=choice.get("finish_reason"),
                 completion_tokens=usage.get("completion_tokens"), prompt_tokens=usage.get("prompt_tokens"),
                 tokens=tuple(tokens), served_id=raw.get("model"), fingerprint=raw.get("system_fingerprint"))


def usable(raw: dict, read: bool = False) -> bool:
    """Whether a raw reply is kept (cached, or taken from the cache): no position of unreadable logprobs
    (`unreadable_position`), and for a read, top-k logprobs at its first token."""
    if unreadable_position(raw) is not None:
        return False
    if not read:  # a generation's reply is not parsed here (it may hold thousands of tokens)
        return True
    tokens = _reply(raw).tokens
    return bool(tokens and tokens[0].top)


@dataclass(frozen=True)
class TopKMass:
    """Mass on each token set (letters, words) at one read position, from the server's top k."""

    mass: tuple[float, ...]
    """Per set: the summed probability of its forms in the top k; NaN when none of them is there."""
    outside: tuple[str, ...]
    """The sets none of whose forms is in the top k (their mass is NaN, never zero)."""
    unseen: float
    """1 - (mass of the top k): what the server did not show."""
    token_bound: float
    """The most any token outside the top k can hold: min(p_k, unseen)."""
    k: int
    """Alternatives the server returned at the position."""
    tempered: tuple[float, ...]
    """Per set: the probability that a token sampled at the read's temperature (after top-p) is in it,
    computed over the top k (the unseen remainder is not sampled from); NaN for a set outside."""


def _nucleus(probs: list[float], temperature: float, top_p: float) -> list[float]:
    """engine.sampling.tempered_distribution's rule over a short list of probabilities (most likely first)."""
    if temperature == 0:
        return [1.0 if i == 0 else 0.0 for i in range(len(probs))]
    w = [p ** (1.0 / temperature) if p > 0 else 0.0 for p in probs]
    z = sum(w) or 1.0
    w = [x / z for x in w]
    if top_p < 1.0:
        keep, cum = [False] * len(w), 0.0
        for i in sorted(range(len(w)), key=lambda i: w[i]):  # ascending, as the local sampler drops
            cum += w[i]
            keep[i] = cum > 1.0 - top_p
        keep[0] = True
        w = [x if k else 0.0 for x, k in zip(w, keep)]
        z = sum(w) or 1.0
        w = [x / z for x in w]
    return w


def topk_mass(top: Sequence[tuple[str, float]], forms: Sequence[Sequence[str]], names: Sequence[str],
              temperature: float = 1.0, top_p: float = 1.0, match=None) -> TopKMass:
    """Mass of each set of forms (`forms[i]`, token texts) in the top-k list `top`; `match(text, i)`, if
    given, replaces exact text matching (the NSI word-start rule)."""
    probs = [p for _, p in top]
    seen = sum(probs)
    unseen = max(0.0, 1.0 - seen)
    bound = min(probs[-1], unseen) if probs else 1.0
    tempered_all = _nucleus(probs, temperature, top_p)
    mass, tempered, outside = [], [], []
    for i, fs in enumerate(forms):
        hits = [j for j, (t, _) in enumerate(top) if (match(t, i) if match is not None else t in fs)]
        if hits:
            mass.append(sum(probs[j] for j in hits))
            tempered.append(sum(tempered_all[j] for j in hits))
        else:
            mass.append(math.nan)
            tempered.append(math.nan)
            outside.append(names[i])
    return TopKMass(tuple(mass), tuple(outside), unseen, bound, len(top), tuple(tempered))


def letter_forms(letters: Sequence[str]) -> list[list[str]]:
    """Per letter, the token texts it is read as (READ_FORMS)."""
    return [[f.format(L=letter) for f in READ_FORMS] for letter in letters]


class ServedModel:
    """A chat model behind an OpenAI-compatible endpoint, with the engine's two primitives: generate text,
    and read the top-k distribution at the next token."""

    served = True

    def __init__(self, spec: ServedSpec):
        from engine.paths import cache_root

        self.spec = spec
        root = Path(spec.cache) if spec.cache else cache_root() / "served"
        self.client = Client(spec.url, spec.name, spec.key_env, ReplyCache(root), spec.client)
        self.cache_dir = root
        self.served_ids: set[str] = set()
        self.fingerprints: set[str] = set()

    # -- requests ----------------------------------------------------------------------------------
    def body(self, messages: Sequence[dict], *, max_tokens: int, temperature: float, top_p: float = 1.0,
             seed: int | None = None, logprobs: bool = False) -> dict:
        body = {"model": self.spec.name, "messages": [dict(m) for m in messages], "max_tokens": int(max_tokens),
                "temperature": float(temperature), "top_p": float(top_p)}
        if seed is not None:
            body["seed"] = int(seed) % (2**31)  # servers take a 32-bit seed
        if logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = int(self.spec.top_logprobs)
        return body

    def complete(self, items: Sequence[tuple[dict, int]], on_done=None, read: bool = False) -> list[Reply]:
        """Replies to (body, sample index) pairs, from the cache or the endpoint; only `usable` ones are cached.
        NonFiniteLogitsError when a reply's logprobs say the model's logits were NaN or infinite
        (`unreadable_position`), once every request is answered: that reply is never cached, the others are."""
        raws = self.client.chat_many(items, on_done, partial(usable, read=read))
        for raw, (body, sample) in zip(raws, items):
            self._refuse_unreadable(raw, body, sample)
        replies = [_reply(r) for r in raws]
        for r in replies:
            if r.served_id:
                self.served_ids.add(r.served_id)
            if r.fingerprint:
                self.fingerprints.add(r.fingerprint)
        return replies

    def read_bodies(self, messages: Sequence[dict], prefill: str | None = None) -> dict:
        """The body of a read: one token, greedy, with top-k logprobs; `prefill` is the assistant's text so far."""
        msgs = list(messages) + ([{"role": "assistant", "content": prefill}] if prefill else [])
        body = self.body(msgs, max_tokens=1, temperature=0.0, logprobs=True)
        if prefill:
            body.update(PREFILL_FIELDS)
        return body

    def read(self, reads: Sequence[tuple[Sequence[dict], str | None]], on_done=None) -> list[Reply]:
        """Top-k at the next token after each (messages, prefill); ServedError if a reply carries no logprobs."""
        replies = self.complete([(self.read_bodies(m, p), 0) for m, p in reads], on_done, read=True)
        for r in replies:
            if not r.tokens or not r.tokens[0].top:
                raise ServedError(f"{self.spec.url}: model {self.spec.name!r} returned no top_logprobs at a read "
                                  "position; this readout needs a server that returns logprobs")
        return replies

    def _refuse_unreadable(self, raw: dict, body: dict, sample: int) -> None:
        """NonFiniteLogitsError (one line) when `raw` holds a position of unreadable logprobs."""
        i = unreadable_position(raw)
        if i is None:
            return
        last = " ".join(str(((body.get("messages") or [{}])[-1]).get("content", "")).split())
        raise NonFiniteLogitsError(
            f"{self.spec.url}: model {self.spec.name!r} sent logprobs no softmax gives (NaN, above 0, or all null) at generated token "
            f"{i + 1} of {len(_positions(raw))} (sample {sample}, last message {last[:40]!r}): the served model's logits "
            "there were NaN or infinite (its weights, or a dtype too narrow for its activations), or the server wrote "
            "them wrongly; that reply is not cached, the others are: the same command resumes once the server is fixed")

    # -- capability and provenance -----------------------------------------------------------------
    def check_logprobs(self) -> None:
        """Before a run's requests: one request (cached like any other) asking for top-k logprobs; ServedError (one line)
        when the server returns none, so readouts that need them are refused before any of their requests."""
        body = self.body([{"role": "user", "content": "Say A."}], max_tokens=1, temperature=0.0, logprobs=True)
        raw = self.client.chat(body, 0, accept=partial(usable, read=True))
        self._refuse_unreadable(raw, body, 0)
        r = _reply(raw)
        if r.served_id:
            self.served_ids.add(r.served_id)
        if not r.tokens or not r.tokens[0].top:
            raise ServedError(f"{self.spec.url}: model {self.spec.name!r} returns no logprobs; the letter and continuous "
                              "readouts need top-k logprobs (use a server that returns them, e.g. vLLM or llama.cpp)")

    def read_params(self) -> dict:
        """The parameters of every read request (recorded in the manifest)."""
        return {"max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": self.spec.top_logprobs}

    def manifest(self) -> dict:
        """What the run manifest records of the endpoint (never the key)."""
        return {"url": self.spec.url, "key_env": self.spec.key_env, "served_ids": sorted(self.served_ids),
                "fingerprints": sorted(self.fingerprints), "top_logprobs": self.spec.top_logprobs,
                "cache": str(self.cache_dir), "read_forms": list(READ_FORMS),
                "client": {"concurrency": self.spec.client.concurrency, "retries": self.spec.client.retries,
                           "backoff": self.spec.client.backoff, "timeout": self.spec.client.timeout}}
