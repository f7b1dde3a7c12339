"""Running many cases: killable workers, the sweep, resume, the case cache, provenance, compare."""
