"""asv plugin (``asv.conf.json`` ``"plugins"``): an existing environment is named by what it holds.

asv names an existing environment after the interpreter's path and records no versions, so the
same stack run from another folder starts another history. Here it takes the Python version and the
versions of ``attnbench.run.environment.NAMED`` as ``python`` and ``requirements``, and so asv's stock
name: ``existing-py3.12-jax0.11.2-torch2.11.0`` (the sidecars' name too). An interpreter that holds
exactly an ``asv.conf.json`` environment's pins (the venvs ``make setup`` builds, which ``make bench``
measures) is that environment: it gets the entry's requirements and asv's name for it
(``virtualenv-py3.11-jax0.10.2-jaxlib0.10.2-numpy-torch2.13.0``), so its history goes on.
"""

from __future__ import annotations

import os

from asv import environment as asv_environment

from attnbench.run import environment

_stock_init = asv_environment.ExistingEnvironment.__init__
_stock_run = asv_environment.ExistingEnvironment.run


def _init(self, conf, executable, requirements, tagged_env_vars):
    _stock_init(self, conf, executable, requirements, tagged_env_vars)
    facts = environment.probe(self._executable)
    self._python, self._requirements = facts["python"], dict(facts["versions"])
    entry = environment.conf_environment(getattr(conf, "include", None) or [], facts["python"],
                                         facts.get("pins") or {})
    self._conf_entry = entry is not None
    if entry is not None:  # asv.conf.json's environment, built by make with its pins: asv's name for it
        self._requirements = dict(entry["req"])
    self._global_env_vars["ASV_ENV_NAME"] = self.name


def _run(self, args, **kwargs):
    """asv's ``run``, with ``ASV_ENV_NAME`` in the process's environment: asv passes its variables to a
    virtualenv's benchmark processes only, and the sidecars and traces are filed under this name."""
    base = kwargs.get("env")
    kwargs["env"] = {**(os.environ if base is None else base), "ASV_ENV_NAME": self.name}
    return _stock_run(self, args, **kwargs)


def _name(self) -> str:
    tool = "virtualenv" if getattr(self, "_conf_entry", False) else self.tool_name
    return asv_environment.get_env_name(tool, self._python, self._requirements, self._tagged_env_vars)


def setup() -> None:
    """asv calls this once when it loads the plugin."""
    existing = asv_environment.ExistingEnvironment
    if existing.__init__ is not _init:
        existing.__init__ = _init
        existing.run = _run
        existing.name = property(_name)  # from _python and _requirements
