"""Make an ``asv publish`` site work without internet, serve it on loopback, check it in chromium.

The stock asv 0.6.6 page loads jQuery, Flot, flot-orderbars, stupidtable, blueimp-md5 and Bootstrap
from CDNs; offline it shows only ``error.html``. One module per job:

- :mod:`.vendor`: the CDN URL table and :func:`fetch_vendor`, which fills a vendor cache
  (``.asv/vendor``) with those libraries via ``npm pack``.
- :mod:`.rewrite`: :func:`make_offline` copies them to ``<html_dir>/vendor/`` and rewrites the URLs
  in every published ``.html``, ``.js`` and ``.css`` file. ``asv publish`` rewrites ``index.html``
  each time, so run it after every publish.
- :mod:`.serve`: :func:`serve` serves the site over HTTP on 127.0.0.1.
- :mod:`.browser`: :func:`check_published_site` opens graph pages in headless chromium with the
  network cut and checks that flot plotted data, with no asv error, JS error or failed load.

CLI (:mod:`.__main__`): ``python -m attnbench.offline_html HTML_DIR [--serve PORT]
[--check NAME ... --screenshot PNG]``.
"""

from .browser import (
    CHROMIUM_INSTALL_HINT,
    PageResult,
    SiteCheckError,
    check_published_site,
    find_chromium,
    graph_url,
    run_chromium,
)
from .rewrite import external_references, make_offline
from .serve import serve
from .vendor import (
    DEFAULT_CACHE,
    EXTRA_DIRS,
    PACKAGES,
    URL_MAP,
    VENDOR_SUBDIR,
    OfflineHtmlError,
    copy_vendor,
    fetch_vendor,
)

__all__ = [
    "CHROMIUM_INSTALL_HINT", "DEFAULT_CACHE", "EXTRA_DIRS", "PACKAGES", "URL_MAP", "VENDOR_SUBDIR",
    "OfflineHtmlError", "PageResult", "SiteCheckError", "check_published_site", "copy_vendor",
    "external_references", "fetch_vendor", "find_chromium", "graph_url", "make_offline",
    "run_chromium", "serve",
]
