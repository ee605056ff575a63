"""The one exception type that the command line turns into a one-line error.

Raise `UserError` for bad input (missing file, wrong format, unreachable server); never a traceback.
"""


class UserError(Exception):
    """A problem the user can fix; printed as `mmscope: error: <message>` with exit status 2."""
