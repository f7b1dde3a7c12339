"""``python -m attnbench.offline_html HTML_DIR [--serve PORT] [--check NAME ... --screenshot PNG]``."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from .browser import SiteCheckError, check_published_site
from .rewrite import make_offline
from .serve import serve
from .vendor import DEFAULT_CACHE, VENDOR_SUBDIR, OfflineHtmlError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attnbench.offline_html",
        description="Make an `asv publish` HTML dir work offline (vendored JS/CSS); "
                    "optionally serve or check it.",
    )
    ap.add_argument("html_dir", type=Path)
    ap.add_argument("--vendor-cache", type=Path, default=None,
                    help=f"npm package cache (default {DEFAULT_CACHE})")
    ap.add_argument("--serve", type=int, metavar="PORT", help="then serve it on 127.0.0.1:PORT until Ctrl-C")
    ap.add_argument("--check", nargs="+", metavar="BENCHMARK",
                    help="then open these benchmarks' graphs (and the grid) in headless chromium")
    ap.add_argument("--screenshot", type=Path, help="with --check: PNG of the first benchmark's graph")
    args = ap.parse_args(argv)
    try:
        done = make_offline(args.html_dir, args.vendor_cache)
        print(f"{args.html_dir}: {len(done)} CDN references now point to {args.html_dir / VENDOR_SUBDIR}/")
        if args.check:
            res = check_published_site(args.html_dir, args.check, args.screenshot)
            for name, r in res.items():
                pts = sum(s["points"] for s in r.probe["series"])
                print(f"ok {name}: {len(r.probe['series'])} series, {pts} points" if name != "#/"
                      else f"ok grid: {len(r.probe['grid_links'])} benchmarks")
    except (OfflineHtmlError, SiteCheckError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.serve is not None:
        server = serve(args.html_dir, args.serve)
        print(f"serving {args.html_dir} at http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)")
        try:
            threading.Event().wait()  # serve() serves in a daemon thread
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
