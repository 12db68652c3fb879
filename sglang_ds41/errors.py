"""The one exception family users see: each message names what was wrong and where."""


class Ds41Error(Exception):
    """A user-facing error. The CLI prints its message (no traceback) and exits non-zero."""
