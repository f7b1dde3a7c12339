"""A module that takes 3 s to import, as torch or jax can on a loaded host (``test_worker``)."""

import time

time.sleep(3)
