"""Measuring one case in this process: the engine, its timing loop, uncertainty, contention and
compiler-cache policy."""
