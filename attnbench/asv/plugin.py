"""asv plugin (``asv.conf.json`` ``"plugins"``): an existing environment is named by what it holds.

asv names an existing environment after the interpreter's path and records no versions, so the
same stack run from another folder starts another history. Here it takes the Python version and the
versions of ``attnbench.run.environment.NAMED`` as ``python`` and ``requirements``, and so asv's stock
name: ``existing-py3.12-jax0.11.2-torch2.11.0`` (the sidecars' name too).
"""

from __future__ import annotations

from asv import environment as asv_environment

from attnbench.run import environment

_stock_init = asv_environment.ExistingEnvironment.__init__


def _init(self, conf, executable, requirements, tagged_env_vars):
    _stock_init(self, conf, executable, requirements, tagged_env_vars)
    facts = environment.probe(self._executable)
    self._python, self._requirements = facts["python"], dict(facts["versions"])
    self._global_env_vars["ASV_ENV_NAME"] = self.name


def setup() -> None:
    """asv calls this once when it loads the plugin."""
    existing = asv_environment.ExistingEnvironment
    if existing.__init__ is not _init:
        existing.__init__ = _init
        existing.name = asv_environment.Environment.name  # from _python and _requirements
