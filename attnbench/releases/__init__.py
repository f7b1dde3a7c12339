"""Fragility across releases: the same kernels over several jax, libtpu and torch releases.

``python -m attnbench releases`` (``make releases``; not part of ``make bench``) runs the matrix:

* ``matrix``: which releases and why, the cells' workloads, what a cell's status means (pure);
* ``cell``: one cell (kernel x workload) inside the release's own environment: import, lower and
  compile, run, numerics against float64, step time, which kernel it became;
* ``run``: the command: builds the release environments through asv's own environment matrix
  (``asv.releases.conf.json``; venvs cached under ``.asv/releases-env``), runs the cells there
  (``benchmarks/releases.py``), runs the torch cells in the torch releases this host has, and
  writes ``results/releases/releases.csv``;
* ``table``: the committed table read back: speed relative to the newest release, the kernel x
  release grid the report and the notebook draw (pure pandas).
"""
