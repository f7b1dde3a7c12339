"""libtpu on its own: a jax release's TPU cells compiled by another release's libtpu.

``python -m attnbench.releases.libtpu_axis ENV_NAME`` runs in a jax release's environment with the
other libtpu first on ``PYTHONPATH`` (``run.libtpu_overlay``: ``pip install --no-deps --target``), so
jax, jaxlib and everything else stay that release's. It files the cells as environment
``ENV_NAME`` (``<jax env>+libtpu<version>``) for the commit in ``ATTNBENCH_COMMIT``, beside asv's.
"""

from __future__ import annotations

import os
import sys

from attnbench.releases.suite import compile_tpu_cells


def main(argv: list[str]) -> int:
    env_name = argv[0]
    context = {"results_dir": os.environ["ATTNBENCH_RESULTS_DIR"], "machine": os.environ["ATTNBENCH_MACHINE"],
               "commit": os.environ["ATTNBENCH_COMMIT"], "env": env_name}
    cells = compile_tpu_cells(context)
    for k, row in sorted(cells.items()):
        status = row.get("status") or "n/a"
        print(f"{env_name} {k}: {status}" + (f" ({row['reason'][:120]})" if row.get("reason") else ""),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
