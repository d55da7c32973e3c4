"""The one error type for bad input."""


class UsageError(Exception):
    """Bad input, or a refusal the user can act on (a record that exists, a locked tree): the
    library raises it with a one-line message, and the CLI prints that line and exits 2."""
