"""What a measurement is about: the workload value type and its masks, presets and shape regimes, the
record and its metrics and statuses, and atomic file writes. Imports no other part of the harness."""
