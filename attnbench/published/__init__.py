"""Published figures: device measurements taken from cited public sources, never measured here.

Each row names its source (a package release or a repository commit), the file it came from and
where to read it. ``tokamax_caches`` reads Tokamax's autotuning caches (the installed wheel's and a
vendored copy of the repository's, ``data/``); ``table`` holds the tidy table's columns and its CSV
(``results/published/tokamax.csv``); ``cli`` is ``python -m attnbench published``.
"""
