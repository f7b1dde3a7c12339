"""Measuring one case in this process: the engine, its timing loop, uncertainty, contention,
compiler-cache policy and the cost of a step."""
