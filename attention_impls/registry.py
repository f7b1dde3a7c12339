"""Name -> implementation instance. Each kernel file registers its one class with ``@register``."""

from __future__ import annotations

import re

_REGISTRY: dict = {}
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def register(cls):
    """Class decorator: instantiate and register under ``cls.name`` (stable kebab-case).

    A kernel lives in the file named after it, so the file list is the kernel list.
    """
    if not _NAME.match(cls.name):
        raise ValueError(f"implementation name must be kebab-case, got {cls.name!r}")
    if cls.name in _REGISTRY:
        raise ValueError(f"implementation {cls.name!r} is registered twice")
    package, _, module = cls.__module__.rpartition(".")
    if package == __package__ and module != cls.name.replace("-", "_"):
        raise ValueError(f"kernel {cls.name!r} must live in attention_impls/"
                         f"{cls.name.replace('-', '_')}.py, not in {module}.py")
    _REGISTRY[cls.name] = cls()
    return cls
