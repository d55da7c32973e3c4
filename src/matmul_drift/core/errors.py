"""The one error type for bad input."""


class UsageError(Exception):
    """Bad input, or a refusal the user can act on (a record that exists, a locked tree): the
    library raises it with a one-line message, and the CLI prints that line and exits 2."""


class Param(str):
    """A parameter's name in the library (``base``) inside a Misuse's words."""


class Misuse(UsageError):
    """Parameters used wrongly, in plain values: ``parts`` are words and Params, joined.
    cli/ words each Param with its flag (``said``)."""

    def __init__(self, *parts: str):
        self.parts = parts
        super().__init__(self.said(str))

    def said(self, word) -> str:
        """The one line, each Param as ``word(param)`` gives it."""
        return "".join(word(p) if isinstance(p, Param) else p for p in self.parts)


class BadValue(Misuse):
    """A value given for one parameter that cannot be used, in plain values: ``param`` (the
    parameter's name in the library, ``slice_n``), ``shown`` (the value as the user gave it,
    None where the parameter itself is meant) and ``problem`` (what is wrong, in words; after a
    colon where ``colon``): '--slice-n 9 is larger than N = 8' once cli/ words it."""

    def __init__(self, param: str, shown: str | None, problem: str, colon: bool = False):
        value = "" if shown is None else f" {shown}"
        super().__init__(Param(param), f"{value}{':' if colon else ''} {problem}")
