"""The one error type that means "the user named something that does not exist".

``UnknownName`` is a ``KeyError`` (a registry lookup that failed) whose message names what was asked
and what is known. The CLI reports it, like a ``ValueError``, as bad input (exit 2, no traceback);
any other ``KeyError`` is a bug and keeps its traceback.
"""

from __future__ import annotations


class UnknownName(KeyError):
    """An unknown kernel, preset, compile target, hardware profile or metric, with the known ones."""

    def __str__(self) -> str:  # KeyError's own str() quotes its message as a repr
        return str(self.args[0]) if self.args else ""
