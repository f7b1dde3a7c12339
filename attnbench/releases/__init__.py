"""Fragility across releases: the same kernels over several jax, libtpu and torch releases.

``python -m attnbench releases`` (``make releases``; not part of ``make bench``); see
docs/releases.md. The release environments come from asv's own environment matrix
(``asv.releases.conf.json``).
"""
