"""The compiled-for tier: jax attention kernels compiled for TPUs and GPUs this host does not have.

Nothing here runs on the target; it records what the target's own compiler decided, in the
targets venv (``.venv-targets``) with ``JAX_PLATFORMS=cpu``. ``hlo``, ``classify``, ``roofline``
and ``records`` are pure logic (no jax), tested without a compiler. See docs/compiled-for.md.
"""
