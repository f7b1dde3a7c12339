"""Reading results: asv's files into one tidy DataFrame, the analysis of regressions and spikes, and
plain-text tables. Reads, never writes."""
