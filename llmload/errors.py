"""The one error a user's input can raise: every command turns it into exit code 2 and its message."""

from __future__ import annotations


class InputError(ValueError):
    """A file, flag or target the user gave that cannot be used; the message names the file, key or flag."""
