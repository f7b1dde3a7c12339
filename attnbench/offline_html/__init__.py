"""Make an ``asv publish`` site work without internet, serve it on loopback, check it in chromium.

The stock asv 0.6.6 page loads its JS/CSS from CDNs; offline it shows only ``error.html``.
``asv publish`` rewrites ``index.html`` each time, so run :func:`make_offline` after every publish.
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
