"""The one error type flashsim raises for bad input.

It subclasses ValueError so callers that already catch ValueError keep working; the CLI
prints its message as one line and exits with status 2.
"""


class FlashsimError(ValueError):
    """Bad input: a size, a name, a plan that does not fit in SRAM, non-finite values."""


class SramOverflowError(FlashsimError):
    """A plan's working set does not fit in the SRAM it was given."""
