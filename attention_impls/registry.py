"""Name -> implementation instance. Modules register their classes with ``@register``."""

from __future__ import annotations

import re

_REGISTRY: dict = {}
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def register(cls):
    """Class decorator: instantiate and register under ``cls.name`` (stable kebab-case)."""
    if not _NAME.match(cls.name):
        raise ValueError(f"implementation name must be kebab-case, got {cls.name!r}")
    if cls.name in _REGISTRY:
        raise ValueError(f"implementation {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls()
    return cls
