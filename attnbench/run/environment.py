"""The Python environment the suite runs in: what it holds, what it lacks, and its stable name.

Standard library only: ``make bench ENV=existing PYTHON=...`` runs it in the user's interpreter
(a container's, a conda env's) before anything is installed there.

* :func:`environment_name` names an existing environment by what it holds, the way asv names its own
  virtualenvs: ``existing-py3.12-jax0.11.2-torch2.11.0``. asv's stock name for an existing
  environment is the interpreter's path, so the same stack run from another folder would start
  another history; ``attnbench/asv/plugin.py`` gives asv this name instead.
* :func:`missing` lists what a purpose (``run``, ``bench``, ``test``) needs and this interpreter
  lacks, from ``pyproject.toml``; ``python -m attnbench.run.environment check`` prints it with the
  command that adds it, and installs it when allowed. It never installs a framework.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The distributions an environment is named by (and whose versions asv records as its requirements):
# the frameworks and the TPU compiler, whose releases change what a kernel does.
NAMED = ("jax", "torch", "torch-xla", "libtpu")
# What asv.conf.json pins its environments by: an interpreter holding exactly one entry's pins is
# that environment, and is named as asv names it (``conf_environment``).
PINNED = ("jax", "jaxlib", "torch", "torch-xla", "numpy", "libtpu")
FRAMEWORKS = ("jax", "torch", "torch_xla")  # importable names; at least one is needed
NEVER_INSTALLED = {"jax", "jaxlib", "torch", "torch-xla", "libtpu"}  # the user's stack: never touched
# Which of pyproject's `tools` extra each purpose needs: ONLY_FOR's, else all but NOT_FOR's. `measure`
# is what measuring alone needs, with no asv or report (tools/device-run.sh on a lent accelerator);
# every purpose needs the project's own dependencies (asv_runner among them: the median's interval).
NOT_FOR = {"bench": {"pytest", "ruff", "nbclient", "nbformat", "ipykernel"}, "test": {"ruff"}}
ONLY_FOR = {"run": set(), "measure": {"threadpoolctl", "absl-py"}}
PURPOSES = ("run", "measure", "bench", "test")
PYPROJECT = os.path.join(CHECKOUT, "pyproject.toml")
MIN_PYTHON = (3, 11)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str]:
    """``{distribution: version}`` of the ``NAMED`` ones installed here, local part dropped
    (``2.11.0+cu130`` -> ``2.11.0``: the build tag is the sidecar's to record, not the name's)."""
    found = {}
    for dist in NAMED:
        version = _version(dist)
        if version:
            found[dist] = version.split("+", 1)[0]
    return found


def pinned_versions() -> dict[str, str]:
    """``{distribution: version}`` of the ``PINNED`` ones installed here, local part dropped."""
    return {dist: version.split("+", 1)[0] for dist in PINNED if (version := _version(dist))}


def conf_environment(include: list[dict], python: str, pins: dict[str, str]) -> dict | None:
    """The ``asv.conf.json`` ``include`` entry an interpreter is (its Python, every pin of the entry
    installed at the pinned version, a blank pin at any, and no other ``NAMED`` framework), or None.
    ``make bench`` measures in the venvs ``make setup`` built with those pins, so their results carry
    the name asv gives the entry (``virtualenv-py3.11-jax0.10.2-...``), continuing its history."""
    for entry in include:
        req = {_canonical(k): v for k, v in (entry.get("req") or {}).items()}
        if str(entry.get("python", "")) != python or not req:
            continue
        if any(k not in pins or (v and pins[k] != v) for k, v in req.items()):
            continue
        if any(dist in pins and dist not in req for dist in NAMED):
            continue
        return entry
    return None


def conf_include(conf_dir: str = CHECKOUT) -> list[dict]:
    """``asv.conf.json``'s ``include`` entries (its ``//`` comment lines dropped, as asv reads it)."""
    path = os.path.join(conf_dir, "asv.conf.json")
    try:
        with open(path, encoding="utf-8") as fh:
            text = "\n".join(line for line in fh if not line.lstrip().startswith("//"))
        return list(json.loads(text).get("include") or [])
    except (OSError, ValueError):
        return []


def asv_environment_name(conf_dir: str = CHECKOUT, facts: dict | None = None) -> str:
    """An interpreter's environment name as ``make bench`` files it: asv's name for the
    ``asv.conf.json`` environment whose pins it holds (``conf_environment``), else
    ``environment_name``; the plugin gives asv the same name. ``facts``: another interpreter's
    ``probe``; None: this one."""
    if facts is None:
        facts = {"python": f"{sys.version_info[0]}.{sys.version_info[1]}", "versions": versions(),
                 "pins": pinned_versions()}
    entry = conf_environment(conf_include(conf_dir), facts["python"], facts.get("pins") or {})
    if entry is None:
        return environment_name(facts["python"], facts["versions"])
    req = sorted((k, v) for k, v in entry["req"].items())
    return "-".join(["virtualenv", f"py{facts['python']}"] + [f"{k}{v}" if v else k for k, v in req])


def environment_name(python: str | None = None, named: dict[str, str] | None = None) -> str:
    """``existing-py<major.minor>-<dist><version>...``, distributions sorted, as asv's
    ``environment.get_env_name`` builds a virtualenv's name from its requirements."""
    python = python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    named = versions() if named is None else named
    return "-".join(["existing", f"py{python}"] + [f"{k}{v}" for k, v in sorted(named.items())])


# What the asv process asks another interpreter (``probe``): its Python and NAMED versions.
PROBE = ("import json, sys; from attnbench.run import environment as e; "
         "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], 'versions': e.versions(), "
         "'pins': e.pinned_versions()}))")


def probe(executable: str) -> dict:
    """``{"python": "3.12", "versions": {...}, "pins": {...}}`` of the interpreter ``executable``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (CHECKOUT, env.get("PYTHONPATH")) if p)
    out = subprocess.run([executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    if out.returncode:
        raise RuntimeError(f"{executable} could not report its versions: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- what a purpose needs -------------------------------------------------------------------------
def _dist_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip()


def requirements(purpose: str, pyproject: str = PYPROJECT) -> list[str]:
    """The requirement strings ``purpose`` needs: the project's own dependencies, plus those of the
    ``tools`` extra in ``ONLY_FOR[purpose]``, else all but ``NOT_FOR[purpose]``; never a framework."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}")
    with open(pyproject, "rb") as fh:
        project = tomllib.load(fh)["project"]
    needed = list(project["dependencies"])
    for requirement in project["optional-dependencies"]["tools"]:
        name = _canonical(_dist_name(requirement))
        keep = name in ONLY_FOR[purpose] if purpose in ONLY_FOR else name not in NOT_FOR[purpose]
        if keep:
            needed.append(requirement)
    return [r for r in needed if _canonical(_dist_name(r)) not in NEVER_INSTALLED]


def _canonical(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:4])


def satisfied(requirement: str, installed: str | None) -> bool:
    """Whether ``installed`` meets ``requirement``'s ``==X``, ``==X.*``, ``>=X`` (the forms
    pyproject uses); any version meets a bare name."""
    if installed is None:
        return False
    spec = requirement[len(_dist_name(requirement)):].split(";")[0].strip()
    for clause in filter(None, (c.strip() for c in spec.split(","))):
        op, value = re.match(r"(==|>=)\s*(.+)", clause).groups()
        if op == ">=" and _release(installed) < _release(value):
            return False
        if op == "==" and value.endswith(".*") and \
                _release(installed)[:len(_release(value))] != _release(value):
            return False
        if op == "==" and not value.endswith(".*") and _release(installed) != _release(value):
            return False
    return True


def missing(purpose: str) -> list[str]:
    """The requirements of ``purpose`` this interpreter lacks or has at a version off the pin."""
    return [r for r in requirements(purpose) if not satisfied(r, _version(_dist_name(r)))]


def frameworks() -> list[str]:
    """The frameworks importable here (``numpy`` first: the float64 reference is always measured)."""
    return ["numpy"] + [f for f in FRAMEWORKS if importlib.util.find_spec(f) is not None]


def check(purpose: str, install: bool = False, out=None) -> int:
    """Say what this interpreter holds and lacks for ``purpose``; 0 when nothing is (still) missing."""
    out = out or sys.stdout
    exe = sys.executable
    print(f"attnbench: {exe} (Python {sys.version.split()[0]}), environment "
          f"{environment_name()}", file=out)
    if sys.version_info[:2] < MIN_PYTHON:
        print(f"  Python {sys.version.split()[0]} is older than {'.'.join(map(str, MIN_PYTHON))}: "
              "the harness needs tomllib", file=out)
        return 1
    found = {f: _version(f.replace("_", "-")) for f in FRAMEWORKS}
    print("  frameworks: " + ", ".join(f"{f} {v}" if v else f"{f} (not installed)" for f, v in found.items()),
          file=out)
    if not any(found.values()):
        print("  no framework to measure: install jax or torch yourself (this mode never installs "
              "a framework: it measures the stack you have)", file=out)
        return 1
    lacking = missing(purpose)
    if not lacking:
        print(f"  everything {purpose} needs is here", file=out)
        return 0
    command = [exe, "-m", "pip", "install", *lacking]
    print(f"  missing for {purpose}: {', '.join(lacking)}", file=out)
    if not install:
        print("  add them with: " + " ".join(_quote(c) for c in command), file=out)
        print("  (or let make do it: ALLOW_INSTALL=1; it installs these and never jax or torch)", file=out)
        return 1
    print("  installing: " + " ".join(_quote(c) for c in command), file=out)
    if subprocess.run(command).returncode:
        return 1
    importlib.invalidate_caches()  # the new distributions become visible to importlib.metadata
    still = missing(purpose)
    if still:
        print(f"  still missing after pip: {', '.join(still)}", file=out)
        return 1
    return 0


def _quote(text: str) -> str:
    return f"'{text}'" if re.search(r"[<>=*\[ ]", text) else text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnbench.run.environment", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="what this interpreter lacks for a purpose, and the command adding it")
    p.add_argument("--need", choices=PURPOSES, default="bench")
    p.add_argument("--install", action="store_true", help="pip install what is missing (never a framework)")
    sub.add_parser("name", help="this environment's stable name (existing-py3.12-jax0.11.2-...)")
    sub.add_parser("frameworks", help="the frameworks importable here, comma-separated")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(args.need, install=args.install)
    print(environment_name() if args.command == "name" else ",".join(frameworks()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
