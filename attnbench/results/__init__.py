"""Reading results: asv's files into one tidy DataFrame, the analysis of regressions and spikes,
tables, and atomic writes."""
