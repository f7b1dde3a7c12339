"""What a measurement is about: the workload value type and its masks, presets and shape regimes, the
record and its metrics, statuses and cost. Imports no other part of the harness."""
