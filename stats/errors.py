"""The stats layer's exception types: one per kind of bad input, each with a one-line message.

The CLI catches `StatsInputError` once and prints the message (exit code 2); nothing here retries or
guesses around a broken input.
"""


class StatsInputError(ValueError):
    """Base class: bad input to the stats layer. Messages are one line and name the file or column."""


class RunDirError(StatsInputError):
    """A run directory (or one of its files) is missing or unreadable."""


class TableSchemaError(StatsInputError):
    """A table lacks a required column (or has one of the wrong kind)."""


class TableValueError(StatsInputError):
    """A table's values contradict its format: duplicated keys, inconsistent scenario metadata."""


class CompareError(StatsInputError):
    """Run directories that cannot be compared as asked (too few runs, unknown role names)."""
