"""The stats layer's exception types: one root, one subclass per kind of bad input, one-line messages.

Every error the stats layer raises on bad input is a `StatsInputError`; the CLI catches that one type and
prints the message (exit code 2). Nothing here retries or guesses around a broken input.
"""


class StatsInputError(ValueError):
    """Base class: bad input to the stats layer. Messages are one line and name the file or column."""


class RunDirError(StatsInputError):
    """A run directory (or one of its files) is missing or unreadable."""


class TableSchemaError(StatsInputError):
    """A table lacks a column the contract declares (or holds one of the wrong kind)."""


class TableValueError(StatsInputError):
    """A table's values contradict its format: duplicated keys, inconsistent scenario metadata."""


class CompareError(StatsInputError):
    """Run directories that cannot be compared as asked (too few runs, unknown role names)."""


class NSITableError(StatsInputError):
    """A framing-stability table (or a coding/groups file) is missing, malformed, or inconsistent."""
