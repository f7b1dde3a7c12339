"""The compiled-for tier: jax attention kernels compiled for TPUs and GPUs this host does not have.

Nothing here runs or times anything on the target; it records what the target's own compiler
decided (libtpu for TPUs; XLA:GPU with ptxas and cuDNN for NVIDIA GPUs), in the targets venv
(``.venv-targets``) with ``JAX_PLATFORMS=cpu``:

* ``targets``: the targets (``targets.toml``), their hardware profiles, GPU device descriptions,
  and whether this environment has the compilers (``environment_problem``);
* ``compile``: one case compiled and read (memory, kernel evidence, copies, cost, the model),
  traced as on the target (``attention_impls._compile_target.compiling_for``);
* ``worker``: the killable process each compile runs in; ``run``: grids, the longest feasible
  length, tables; ``cli``: ``python -m attnbench compile-for``; ``suite``: the asv classes' grids
  (the toy workload over lengths; the model presets at their real lengths, with their masks);
* ``hlo``, ``classify``, ``roofline``, ``records``: pure logic (no jax), tested without a compiler.

See docs/compiled-for.md, "Compiled for TPUs and GPUs (by the compiler, not measured)".
"""
