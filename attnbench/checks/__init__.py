"""The harness checking itself and the machine: engine self-check, loader speed, noise check, profiler
visibility."""
