"""The library surface a kernel's call uses, read from the installed release: which public names are
there, and their signatures. Comparing two releases' surfaces is the evidence of an API change
(``moved``); an exception's type never is (a missing third-party module raises ImportError too).

A surface is ``{name: entry}`` for each of the kernel's ``public_calls`` and ``interpreter_calls``,
with ``entry`` one of:
- ``{"present": True, "signature": "(q, k, ...)", "params": [...], "var_keyword": bool}``
  (``signature`` ``None`` where Python cannot tell one, as for an enum member);
- ``{"present": False, "missing": "AttributeError: ..."}``: the name is not there, or its module
  does not import (the text says which).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re

# A module of the library that does not import because of a module the library does not ship is a
# packaging fault, not a moved name: ``ModuleNotFoundError: No module named 'absl'``.
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
FRAMEWORK_MODULES = ("jax", "jaxlib", "torch")


def lookup(name: str):
    """The object ``module:attr.attr`` names (raises what importing or getattr raises)."""
    module, _, qualname = name.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def entry(name: str) -> dict:
    """What this environment has under ``name``."""
    try:
        obj = lookup(name)
    except Exception as exc:  # a name, a module, or a module's own import that failed
        text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        return {"present": False, "missing": text}
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # an enum member, or a builtin: its docstring may give the call
        return {"present": True, **documented_signature(obj)}
    params = signature.parameters.values()
    # a default's repr may hold an address (``<object object at 0x7f...>``): not part of the API
    text = re.sub(r" at 0x[0-9a-f]+", "", str(signature))
    return {"present": True, "signature": text[:600], "params": [p.name for p in params],
            "var_keyword": any(p.kind is p.VAR_KEYWORD for p in params)}


def documented_signature(obj) -> dict:
    """A builtin's signature from its docstring's opening (``name(a, b=None) -> T``, as torch's
    ``scaled_dot_product_attention`` documents itself); none where there is no such opening."""
    doc = " ".join((getattr(obj, "__doc__", None) or "").split("\n\n")[0].split())
    opening = re.match(r"^[\w.]+\(", doc) if callable(obj) else None
    params, depth, current = [], 0, ""
    for char in doc[opening.end():] if opening else "":
        depth += 1 if char in "([{" else -1 if char in ")]}" else 0
        if depth < 0 or (char == "," and depth == 0):
            params.append(re.split(r"[=:]", current)[0].strip())
            current = ""
            if depth < 0:
                break
        else:
            current += char
    if depth >= 0:  # no closing bracket: not a signature
        return {"signature": None, "params": [], "var_keyword": True}
    return {"signature": f"({', '.join(p for p in params if p)})"[:600],
            "params": [p.lstrip("*") for p in params if p.lstrip("*")],
            "var_keyword": any(p.startswith("**") for p in params)}


def calls_of(impl) -> dict[str, tuple[str, ...]]:
    return {**impl.public_calls, **impl.interpreter_calls}


def surface(impl) -> dict[str, dict]:
    """The surface of ``impl``'s calls in this environment (``{}`` for a kernel that declares none)."""
    return {name: entry(name) for name in calls_of(impl)}


def surface_text(impl) -> str | None:
    found = surface(impl)
    return json.dumps(found, sort_keys=True) if found else None


def parse(text) -> dict[str, dict]:
    """A surface as filed (JSON text); ``{}`` for none."""
    if not isinstance(text, str) or not text:
        return {}
    return json.loads(text)


def not_shipped(missing: str) -> str | None:
    """The module a missing entry's reason names when the library does not ship it (packaging)."""
    found = _NO_MODULE.search(missing)
    if found and found.group(1).split(".")[0] not in FRAMEWORK_MODULES:
        return found.group(1)
    return None


def moved(calls: dict[str, tuple[str, ...]], before: dict, after: dict) -> list[str]:
    """What moved between two releases' surfaces for a call passing ``calls``' keywords: a name
    present before and gone after (not for a module the release does not ship), or a keyword the call
    passes that the later signature no longer takes. Each item is the evidence, in words."""
    out = []
    for name, keywords in calls.items():
        old, new = before.get(name), after.get(name)
        if not old or not new or not old.get("present"):
            continue  # not read in one of them, or not there before: nothing an upgrade took away
        if not new.get("present"):
            if not not_shipped(new["missing"]):
                out.append(f"{name} is gone ({new['missing']})")
            continue
        if new.get("var_keyword") or new.get("signature") is None or old.get("signature") is None:
            continue  # takes any keyword, or a side's signature could not be read
        lost = [k for k in keywords if k in old.get("params", []) or old.get("var_keyword")
                if k not in new.get("params", [])]
        if lost:
            out.append(f"{name} no longer takes {', '.join(lost)}: {old.get('signature')} -> "
                       f"{new.get('signature')}")
    return out


def changed(before: dict, after: dict) -> list[str]:
    """Parameters added to or removed from a name present in both surfaces, in words (an added one
    is no break: a keyword with a default keeps every call working; ``moved`` says what breaks)."""
    out = []
    for name in sorted(before.keys() & after.keys()):
        old, new = before[name], after[name]
        if not (old.get("present") and new.get("present")) or None in (old.get("signature"),
                                                                       new.get("signature")):
            continue
        added = [p for p in new.get("params", []) if p not in old.get("params", [])]
        removed = [p for p in old.get("params", []) if p not in new.get("params", [])]
        out += [f"{name} gained {', '.join(added)}"] if added else []
        out += [f"{name} lost {', '.join(removed)}"] if removed else []
    return out
