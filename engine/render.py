"""Turning a prompt into token ids: the chat frame through the tokenizer's own template, tokenized
once, and the raw frame with the tokenizer's normal BOS rule. Exactly one BOS, never two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from engine.errors import RenderError


def tokenizer_adds_bos(tokenizer) -> bool:
    """Whether the tokenizer prepends its BOS when encoding plain text (Llama-3 style post-processor).
    Found once per tokenizer and BOS (kept on the tokenizer object)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    known = getattr(tokenizer, "_readout_adds_bos", None)
    if known is not None and known[0] == bos:
        return known[1]
    ids = tokenizer("x", add_special_tokens=True)["input_ids"]
    adds = len(ids) > 0 and ids[0] == bos
    tokenizer._readout_adds_bos = (bos, adds)
    return adds


def encode_raw(tokenizer, text: str) -> list[int]:
    """Raw frame: plain text, no template, BOS exactly as the tokenizer adds it for ordinary text."""
    if not text:
        raise RenderError("raw prompt: text is empty")
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def encode_chat(tokenizer, messages: list[dict], system: str | None = None) -> list[int]:
    """Chat frame with the generation prompt appended, ready for the model's first reply token.

    `system=None` keeps whatever the template does when no system message is given (OLMo-3 and Qwen2.5
    inject a default one); a string *replaces* that default by becoming the first message. The template
    is rendered and tokenized in one call without special tokens, so a template that writes BOS itself
    (Llama-3.1) gets exactly one; a template that omits BOS for a tokenizer that normally adds one
    (Tulu 3) gets the tokenizer's BOS prepended, as in plain-text encoding.
    """
    messages = _chat_messages(tokenizer, messages, system)
    try:
        encoded = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, **template_kwargs(tokenizer)
        )
    except Exception as exc:  # jinja raise_exception, bad roles: the template's own complaint
        raise _refused(exc) from None
    return _one_bos(tokenizer, list(encoded["input_ids"]))


def template_kwargs(tokenizer) -> dict:
    """Extra variables chat prompts are rendered with: those `load_model(template_kwargs=...)` set on this tokenizer."""
    return dict(getattr(tokenizer, "_readout_template_kwargs", None) or {})


def _refused(exc: Exception) -> RenderError:
    return RenderError(f"chat template refused the messages: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


def _chat_messages(tokenizer, messages, system) -> list[dict]:
    """The messages checked, with `system` as the first message when given."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise RenderError("chat frame asked for, but the tokenizer has no chat template (use a raw text prompt)")
    if not messages:
        raise RenderError("chat prompt: messages are empty")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - {"role", "content"} or "role" not in message or "content" not in message:
            raise RenderError(f"chat prompt: messages[{i}] must be an object with exactly 'role' and 'content'")
        if not isinstance(message["content"], str) or not isinstance(message["role"], str):
            raise RenderError(f"chat prompt: messages[{i}]: role and content must be strings")
    if system is not None:
        if messages[0]["role"] == "system":
            raise RenderError("chat prompt: a system prompt was given and the messages already start with one")
        messages = [{"role": "system", "content": system}, *messages]
    return list(messages)


def _one_bos(tokenizer, ids: list[int]) -> list[int]:
    """The tokenizer's BOS prepended where it adds one to plain text and the template did not write it; two is an error."""
    bos = tokenizer.bos_token_id
    if bos is not None and (not ids or ids[0] != bos) and tokenizer_adds_bos(tokenizer):
        ids = [bos, *ids]
    if bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        raise RenderError("chat prompt renders with two BOS tokens; the template and tokenizer disagree")
    return ids


def _tokenize_many(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    """Token ids of many texts. A fast tokenizer whose backend has no truncation or padding set is called
    directly (`encode_batch_fast`: no offsets, no attention masks; about 2.3x the batch call, which
    `--plan` needs); otherwise, and for slow tokenizers, the tokenizer's own batch call. Same ids (tested)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is not None and backend.truncation is None and backend.padding is None:
        return [e.ids for e in fast(texts, add_special_tokens=add_special_tokens)]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]]


def encode_chats(tokenizer, chats: Sequence[tuple[Sequence[dict], str | None]]) -> list[list[int]]:
    """`encode_chat` for many (messages, system) pairs at once: the templates rendered to text, then tokenized in
    one batch call (about twice as fast for thousands of prompts, as `readout run --plan` needs); the same ids
    as `encode_chat` (tested on every template family)."""
    texts = []
    for messages, system in chats:
        try:
            texts.append(tokenizer.apply_chat_template(_chat_messages(tokenizer, list(messages), system),
                                                       add_generation_prompt=True, tokenize=False, **template_kwargs(tokenizer)))
        except RenderError:
            raise
        except Exception as exc:
            raise _refused(exc) from None
    if not texts:
        return []
    return [_one_bos(tokenizer, ids) for ids in _tokenize_many(tokenizer, texts, add_special_tokens=False)]


@dataclass(frozen=True)
class Prompt:
    """One prompt, before tokenization: chat messages or raw text."""

    messages: tuple[dict, ...] | None = None
    """Chat messages (role/content) for the chat frame."""
    text: str | None = None
    """Plain text for the raw frame (no template)."""
    system: str | None = None
    """System prompt replacing the template's default one (chat frame only); None keeps the default."""


def encode_prompt(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt in its frame."""
    if (prompt.messages is None) == (prompt.text is None):
        raise RenderError("a prompt has either messages (chat frame) or text (raw frame), exactly one")
    if prompt.text is not None:
        if prompt.system is not None:
            raise RenderError("a system prompt applies to the chat frame only, not to raw text")
        return encode_raw(tokenizer, prompt.text)
    return encode_chat(tokenizer, list(prompt.messages), system=prompt.system)


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
    """`encode_prompt` for many prompts at once (chat prompts rendered, then every prompt tokenized in batch
    calls); the same ids, in the same order."""
    is_chat = [p.messages is not None and p.text is None for p in prompts]
    chat = [i for i, c in enumerate(is_chat) if c]
    raw = [i for i, c in enumerate(is_chat) if not c]
    out: list[list[int] | None] = [None] * len(prompts)
    for i, ids in zip(chat, encode_chats(tokenizer, [(prompts[i].messages, prompts[i].system) for i in chat])):
        out[i] = ids
    for i in raw:
        if prompts[i].messages is not None or prompts[i].system is not None or not prompts[i].text:
            out[i] = encode_prompt(tokenizer, prompts[i])  # the one-prompt path names what is wrong
    texts = [i for i in raw if out[i] is None]
    if texts:
        for i, ids in zip(texts, _tokenize_many(tokenizer, [prompts[i].text for i in texts], add_special_tokens=True)):
            out[i] = ids
    return out
