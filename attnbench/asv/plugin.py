"""asv plugin (``asv.conf.json`` ``"plugins"``): an existing environment is named by what it holds.

asv names an existing environment (``-E existing:PATH``) after the interpreter's path
(``existing-py_work_main_.venv-targets_bin_python``) and records no library versions, so the same
stack run from another folder or machine starts another history, and its graphs cannot say which
jax or torch they show. Here an existing environment takes its Python version and the versions of
``attnbench.run.environment.NAMED`` (jax, torch, torch-xla, libtpu) as asv's own ``python`` and
``requirements``, and asv's stock naming of virtualenvs: ``existing-py3.12-jax0.11.2-torch2.11.0``.
The benchmarks' sidecars use the same name (``attnbench.run.environment.environment_name``).
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
