"""The one exception type a user should ever see: a clear, one-line message."""


class UserError(Exception):
    """Bad input (config, flags, data, checkpoints): printed as one line, exit code 2."""
