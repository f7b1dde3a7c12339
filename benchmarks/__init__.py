"""The asv suite (thin classes over attnbench.engine) lands here with the asv-suite issue."""
