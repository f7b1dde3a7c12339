"""The glue between asv and the harness: the suite's cases and settings, its sidecar, the plugin,
which environment runs what, and renaming an environment's results."""
