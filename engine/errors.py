"""Exceptions for bad input to the engine: one type per kind, each with a one-line message.

The CLI catches `ReadoutError` once, prints its message on one line and exits with code 2.
"""


class ReadoutError(Exception):
    """Base of every error a user can cause by what they pass in (not a bug in this package)."""


class UnknownModelError(ReadoutError):
    """The model name is neither a registered alias, a local folder, nor a plausible HF id."""


class ModelUnavailableError(ReadoutError):
    """The model is known but its weights are not on this machine (nothing is ever downloaded)."""


class LetterTokenError(ReadoutError):
    """An option letter (or one of its variants) is not exactly one token, or collides with another."""


class RenderError(ReadoutError):
    """A prompt cannot be rendered as asked (no chat template, two system prompts, doubled BOS...)."""


class ProbeInputError(ReadoutError):
    """A probe file or probe record is malformed; the message names the file, line and field."""


class ContextLengthError(ReadoutError):
    """A prompt (with the tokens it may generate) is longer than the model's context; names file, line, field."""


class NonFiniteLogitsError(ReadoutError):
    """The model's next-token logits are NaN or infinite where a letter is read or a token is drawn (its weights, or
    a dtype too narrow for its activations); nothing computed from them is kept."""


class DeviceMemoryError(ReadoutError):
    """The device's memory beside the model's weights cannot hold the keys/values of the longest sequence asked for."""
