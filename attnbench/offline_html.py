"""Make an ``asv publish`` site work without internet, serve it on loopback, check it in chromium.

The stock asv 0.6.6 page loads jQuery, Flot, flot-orderbars, stupidtable, blueimp-md5 and Bootstrap
from CDNs; offline it shows only ``error.html``. :func:`make_offline` rewrites those URLs (in every
published ``.html``, ``.js`` and ``.css`` file) to copies under ``<html_dir>/vendor/`` taken from a
vendor cache that :func:`fetch_vendor` fills with ``npm pack``. ``asv publish`` rewrites
``index.html`` each time, so run it after every publish.

:func:`serve` serves the site over HTTP on 127.0.0.1 (``file://`` would need
``--allow-file-access-from-files``). :func:`check_published_site` opens graph pages in headless
chromium with DNS for every host but 127.0.0.1 blackholed, and checks that flot plotted data points
(read from the live plot by a probe script injected only by the check's server), that no asv error
is shown and that the console has no uncaught error or failed load.

CLI: ``python -m attnbench.offline_html HTML_DIR [--serve PORT] [--check NAME ... --screenshot PNG]``.
"""

from __future__ import annotations

import argparse
import functools
import html as html_lib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = REPO_ROOT / ".asv" / "vendor"  # git-ignored (.asv/)
VENDOR_SUBDIR = "vendor"

# npm packages (exact versions) the site needs: the CDN files of asv 0.6.6's index.html.
PACKAGES: dict[str, str] = {
    "jquery": "3.3.1",
    "flot": "0.8.3",
    "flot-orderbars": "1.0.0",
    "stupid-table-plugin": "1.1.3",  # the CDN's stupidtable 1.0.1 is not on npm; 1.1.3 has the same API
    "blueimp-md5": "2.19.0",
    "bootstrap": "3.1.1",
}

# CDN URL -> (npm package, file inside the package, path under <html_dir>/vendor/).
# flot@0.8.3 on npm ships no .min.js: the unminified files stand in for cdnjs' minified ones.
URL_MAP: dict[str, tuple[str, str, str]] = {
    "https://code.jquery.com/jquery-3.3.1.min.js":
        ("jquery", "dist/jquery.min.js", "jquery-3.3.1/jquery.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js":
        ("flot", "jquery.flot.js", "flot-0.8.3/jquery.flot.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js":
        ("flot", "jquery.flot.time.js", "flot-0.8.3/jquery.flot.time.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js":
        ("flot", "jquery.flot.selection.js", "flot-0.8.3/jquery.flot.selection.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js":
        ("flot", "jquery.flot.categories.js", "flot-0.8.3/jquery.flot.categories.js"),
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js":
        ("flot-orderbars", "js/jquery.flot.orderBars.js", "flot-orderbars-1.0.0/jquery.flot.orderBars.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js":
        ("stupid-table-plugin", "stupidtable.min.js", "stupid-table-plugin-1.1.3/stupidtable.min.js"),
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js":
        ("blueimp-md5", "js/md5.min.js", "blueimp-md5-2.19.0/md5.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js":
        ("bootstrap", "dist/js/bootstrap.min.js", "bootstrap-3.1.1/js/bootstrap.min.js"),
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css":
        ("bootstrap", "dist/css/bootstrap.min.css", "bootstrap-3.1.1/css/bootstrap.min.css"),
}
# Files a vendored file refers to (bootstrap.min.css loads ../fonts/glyphicons-*): package dir -> vendor dir.
EXTRA_DIRS: list[tuple[str, str, str]] = [("bootstrap", "dist/fonts", "bootstrap-3.1.1/fonts")]

CHROMIUM_INSTALL_HINT = (
    "chromium not found (looked for $CHROMIUM, chromium, chromium-browser): `make test` installs it "
    "(apt-get install -y chromium)"
)


class OfflineHtmlError(RuntimeError):
    """The site still references the internet, or the vendor files cannot be had."""


class SiteCheckError(AssertionError):
    """A published page did not render in chromium."""


# --------------------------------------------------------------------------------------------------
# vendor cache


def _pkg_dir(cache_dir: Path, name: str) -> Path:
    return cache_dir / f"{name}-{PACKAGES[name]}" / "package"


def _needed_files(name: str) -> list[str]:
    files = [src for pkg, src, _ in URL_MAP.values() if pkg == name]
    files += [d for pkg, d, _ in EXTRA_DIRS if pkg == name]
    return files


def fetch_vendor(cache_dir: str | os.PathLike | None = None) -> Path:
    """Fill ``cache_dir`` (default ``.asv/vendor``) with the npm packages of :data:`PACKAGES`.

    Each lands, extracted, in ``<cache_dir>/<name>-<version>/package/``. A package whose needed files
    are already there is skipped, so this is cheap to call before every publish. Raises
    :class:`OfflineHtmlError` naming npm when a package is missing and npm is not installed.
    """
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    missing = [
        n for n in PACKAGES if not all((_pkg_dir(cache, n) / f).exists() for f in _needed_files(n))
    ]
    if not missing:
        return cache
    npm = shutil.which("npm")
    if npm is None:
        raise OfflineHtmlError(
            f"npm is not installed: it is needed once to fetch {', '.join(missing)} into {cache} "
            "for the offline asv HTML (Debian: apt-get install -y npm)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as tmp:
        specs = [f"{n}@{PACKAGES[n]}" for n in missing]
        proc = subprocess.run(
            [npm, "pack", *specs, "--json", "--silent"], cwd=tmp, capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise OfflineHtmlError(f"`npm pack {' '.join(specs)}` failed:\n{proc.stderr.strip()}")
        for entry in json.loads(proc.stdout):
            name = entry["name"]
            dest = _pkg_dir(cache, name).parent
            staging = Path(tmp) / f"x-{name}"
            with tarfile.open(Path(tmp) / entry["filename"]) as tar:
                if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
                    tar.extractall(staging, filter="data")
                else:
                    tar.extractall(staging)
            absent = [f for f in _needed_files(name) if not (staging / "package" / f).exists()]
            if absent:
                raise OfflineHtmlError(f"npm package {name}@{entry['version']} lacks {absent}")
            shutil.rmtree(dest, ignore_errors=True)
            staging.rename(dest)
    return cache


# --------------------------------------------------------------------------------------------------
# rewriting

_TAG_RE = re.compile(r"<(script|link)\b[^>]*>", re.IGNORECASE)
_ATTR_RE = re.compile(r"""\b(src|href)\s*=\s*(["'])(.*?)\2""", re.IGNORECASE)
_SRI_RE = re.compile(r"""\s+(integrity|crossorigin|referrerpolicy)(\s*=\s*(["']).*?\3)?""", re.IGNORECASE)
_EXTERNAL = re.compile(r"^(https?:)?//", re.IGNORECASE)
# In JS/CSS: a quoted or url()-wrapped external URL of a script, stylesheet or font.
_EXTERNAL_ASSET_RE = re.compile(
    r"""(?:["'(]|@import\s+)((?:https?:)?//[^"')\s]+?\.(?:m?js|css|woff2?|ttf|eot|svg|otf))(?:[?#][^"')\s]*)?["')]""",
    re.IGNORECASE,
)


def _rel(local: str, page: Path, html_dir: Path) -> str:
    """``vendor/<local>`` relative to the directory of ``page`` (a file under ``html_dir``)."""
    depth = len(page.relative_to(html_dir).parts) - 1
    return "../" * depth + f"{VENDOR_SUBDIR}/{local}"


def _rewrite_tag(tag: str, page: Path, html_dir: Path, done: list) -> str:
    m = _ATTR_RE.search(tag)
    if not m or m.group(3) not in URL_MAP:
        return tag
    url = m.group(3)
    local = _rel(URL_MAP[url][2], page, html_dir)
    done.append((page, url, local))
    tag = tag[: m.start(3)] + local + tag[m.end(3):]
    return _SRI_RE.sub("", tag)  # SRI hashes are the CDN files'; the npm copies differ


def _site_files(html_dir: Path, suffixes: tuple[str, ...]):
    vendor = html_dir / VENDOR_SUBDIR
    for p in sorted(html_dir.rglob("*")):
        if p.is_file() and p.suffix.lower() in suffixes and vendor not in p.parents:
            yield p


def external_references(html_dir: str | os.PathLike) -> list[tuple[Path, str]]:
    """(file, URL) of every external script/stylesheet/font the site would load.

    Covers ``<script src>`` and ``<link href>`` in HTML (except ``rel=alternate``/``canonical``
    links, which browsers do not fetch), and quoted or ``url()`` asset URLs in JS and CSS (including
    the vendored CSS).
    """
    html_dir = Path(html_dir)
    found = []
    for p in _site_files(html_dir, (".html", ".htm")):
        for tag in _TAG_RE.finditer(p.read_text(encoding="utf-8", errors="replace")):
            m = _ATTR_RE.search(tag.group(0))
            if not m or not _EXTERNAL.match(m.group(3)):
                continue
            if tag.group(1).lower() == "link" and re.search(
                r"""\brel\s*=\s*["']?(alternate|canonical)""", tag.group(0), re.IGNORECASE
            ):
                continue
            found.append((p, m.group(3)))
    code = list(_site_files(html_dir, (".js", ".css")))
    code += sorted((html_dir / VENDOR_SUBDIR).rglob("*.css"))
    for p in code:
        for m in _EXTERNAL_ASSET_RE.finditer(p.read_text(encoding="utf-8", errors="replace")):
            found.append((p, m.group(1)))
    return found


def make_offline(html_dir: str | os.PathLike, vendor_dir: str | os.PathLike | None = None) -> list:
    """Point the published site at local copies of its CDN files; return the rewrites made.

    ``vendor_dir`` is the vendor cache (default ``.asv/vendor``, filled by :func:`fetch_vendor`
    when incomplete). Copies the files of :data:`URL_MAP` to ``<html_dir>/vendor/``, rewrites every
    mapped URL in the site's HTML, JS and CSS, then raises :class:`OfflineHtmlError` naming the file
    and URL if any external script/stylesheet reference is left. Idempotent.
    Returns ``[(file, cdn_url, local_url), ...]``.
    """
    html_dir = Path(html_dir)
    if not (html_dir / "index.html").is_file():
        raise OfflineHtmlError(f"{html_dir} has no index.html: run `asv publish` first")
    cache = fetch_vendor(vendor_dir)
    out = html_dir / VENDOR_SUBDIR
    for pkg, src, dst in URL_MAP.values():
        (out / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_pkg_dir(cache, pkg) / src, out / dst)
    for pkg, src, dst in EXTRA_DIRS:
        shutil.copytree(_pkg_dir(cache, pkg) / src, out / dst, dirs_exist_ok=True)

    done: list = []
    for p in _site_files(html_dir, (".html", ".htm", ".js", ".css")):
        text = p.read_text(encoding="utf-8")
        if p.suffix.lower() in (".html", ".htm"):
            new = _TAG_RE.sub(lambda m, p=p: _rewrite_tag(m.group(0), p, html_dir, done), text)
        else:  # JS that injects a tag resolves the URL against the page (index.html at the root)
            new = text
            for url, (_, _, local) in URL_MAP.items():
                if url in new:
                    done.append((p, url, f"{VENDOR_SUBDIR}/{local}"))
                    new = new.replace(url, f"{VENDOR_SUBDIR}/{local}")
        if new != text:
            p.write_text(new, encoding="utf-8")

    left = external_references(html_dir)
    if left:
        listing = "\n".join(f"  {f}: {u}" for f, u in left)
        raise OfflineHtmlError(
            f"external script/stylesheet references remain after rewriting (add them to URL_MAP in "
            f"{__name__}):\n{listing}"
        )
    return done


# --------------------------------------------------------------------------------------------------
# serving


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        self.server.requests.append((self.command, self.path, getattr(self, "_status", None)))

    def send_response(self, code, message=None):
        self._status = code
        super().send_response(code, message)

    def end_headers(self):
        self.send_header("Cache-Control", "no-store")
        super().end_headers()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a browser dropping a load is no error
            super().handle_error(request, client_address)


def serve(html_dir: str | os.PathLike, port: int = 0, *, handler=None) -> ThreadingHTTPServer:
    """Start serving ``html_dir`` on 127.0.0.1:``port`` (0: any free port) in a daemon thread.

    The URL is ``http://127.0.0.1:{server.server_address[1]}/``; stop with ``server.shutdown();
    server.server_close()``. ``server.requests`` lists ``(method, path, status)`` served.
    """
    handler = handler or _QuietHandler
    server = _Server(("127.0.0.1", port), functools.partial(handler, directory=str(html_dir)))
    server.requests = []
    threading.Thread(target=server.serve_forever, name=f"serve {html_dir}", daemon=True).start()
    return server


# --------------------------------------------------------------------------------------------------
# checking in chromium

PROBE_PATH = "/__attnbench_probe.js"
# Injected first thing in <head> by the check's server only: records errors, then (once flot has
# drawn) writes what the live plot holds into <pre id="attnbench-probe"> for --dump-dom.
PROBE_JS = r"""
(function () {
  var errors = [];
  window.addEventListener('error', function (e) {
    errors.push('Uncaught ' + (e.message || (e.target && (e.target.src || e.target.href)) || 'error'));
  }, true);
  window.addEventListener('unhandledrejection', function (e) {
    errors.push('Unhandled rejection: ' + e.reason);
  });
  function report() {
    var out = {href: location.href, errors: errors, jquery: !!window.jQuery, series: [], error_message: null};
    if (window.jQuery) {
      var $ = window.jQuery;
      out.error_message = $.trim($('#error-message').text());
      out.title = $.trim($('#title').text());
      out.graph_visible = $('#graph-display').is(':visible');
      out.canvas = $('#main-graph canvas.flot-base').length;
      out.legend = $('#main-graph .legendLabel').map(function () { return $(this).text(); }).get();
      out.grid_links = $('#summarygrid-display a.benchmark-container').map(
        function () { return $(this).attr('href'); }).get();
      var plot = $('#main-graph').data('plot');
      if (plot) {
        $.each(plot.getData(), function (i, s) {
          var n = 0;
          $.each(s.data || [], function (j, pt) { if (pt && pt[1] !== null && isFinite(pt[1])) n++; });
          out.series.push({label: s.label || null, points: n});
        });
      }
    }
    var el = document.getElementById('attnbench-probe');
    if (!el && document.body) {
      el = document.createElement('pre'); el.id = 'attnbench-probe'; el.style.display = 'none';
      document.body.appendChild(el);
    }
    if (el) el.textContent = JSON.stringify(out);
  }
  setInterval(report, 250);
})();
"""


class _ProbeHandler(_QuietHandler):
    def do_GET(self):
        path = urlsplit(self.path).path
        if path == PROBE_PATH:
            return self._send(PROBE_JS.encode(), "application/javascript")
        if path in ("/", "/index.html"):
            text = (Path(self.directory) / "index.html").read_text(encoding="utf-8")
            text = re.sub(r"<head>", f'<head><script src="{PROBE_PATH}"></script>', text, count=1)
            return self._send(text.encode(), "text/html; charset=utf-8")
        return super().do_GET()

    def _send(self, body: bytes, ctype: str):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def find_chromium() -> str:
    for cand in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "/usr/bin/chromium"):
        if cand and (path := shutil.which(cand)):
            return path
    raise SiteCheckError(CHROMIUM_INSTALL_HINT)


_CONSOLE_RE = re.compile(r":(?:INFO|WARNING|ERROR):CONSOLE[^\]]*\]\s*(.*)")
_BAD_CONSOLE = ("Uncaught", "Failed to load resource", "net::ERR_", "Refused to")


def run_chromium(url: str, *, dump_dom: bool = True, screenshot: str | os.PathLike | None = None,
                 budget_ms: int = 8000, window: str = "1400,900",
                 timeout: float = 90) -> tuple[str, list[str]]:
    """Load ``url`` in headless chromium offline (only 127.0.0.1 resolves); return (DOM, console lines)."""
    chromium = find_chromium()
    with tempfile.TemporaryDirectory(prefix="attnbench-chromium-") as profile:
        cmd = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-extensions",
            "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            f"--virtual-time-budget={budget_ms}", f"--window-size={window}",
        ]
        cmd += ["--dump-dom"] if dump_dom else []
        cmd += [f"--screenshot={Path(screenshot).resolve()}"] if screenshot else []
        proc = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=timeout)
    console = [m.group(1) for m in map(_CONSOLE_RE.search, proc.stderr.splitlines()) if m]
    if proc.returncode != 0:
        raise SiteCheckError(f"chromium exited {proc.returncode} on {url}:\n{proc.stderr[-3000:]}")
    return proc.stdout, console


def _probe(dom: str) -> dict | None:
    m = re.search(r'<pre id="attnbench-probe"[^>]*>(.*?)</pre>', dom, re.DOTALL)
    return json.loads(html_lib.unescape(m.group(1))) if m else None


@dataclass
class PageResult:
    url: str
    probe: dict
    console: list[str] = field(default_factory=list)


def graph_url(base: str, benchmark_name: str) -> str:
    """asv graph pages are hash routes on index.html: ``index.html#<benchmark name>``."""
    return f"{base}index.html#{quote(benchmark_name, safe='.-_')}"


def check_published_site(html_dir: str | os.PathLike, benchmark_names, screenshot_path=None, *,
                         budget_ms: int = 8000, min_points: int = 1) -> dict[str, PageResult]:
    """Open the grid and each benchmark's graph page of an offline published site in chromium.

    Raises :class:`SiteCheckError` listing every problem: an external reference left in the site,
    a page that fell back to error.html, an asv error message, a graph without a flot canvas or
    with fewer than ``min_points`` plotted values, a benchmark missing from the grid, an uncaught
    JS error, a failed or blocked load (the console) or a 404 (the server). Saves a PNG of the
    first benchmark's graph to ``screenshot_path`` when given. Returns the probes by page name.
    """
    html_dir = Path(html_dir)
    benchmark_names = list(benchmark_names)
    problems = [f"{f}: external reference {u}" for f, u in external_references(html_dir)]
    results: dict[str, PageResult] = {}
    server = serve(html_dir, handler=_ProbeHandler)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        pages = [("#/", f"{base}index.html#/", None)]
        for i, name in enumerate(benchmark_names):
            shot = screenshot_path if (i == 0 and screenshot_path) else None
            pages.append((name, graph_url(base, name), shot))
        for name, url, shot in pages:
            if shot:
                Path(shot).parent.mkdir(parents=True, exist_ok=True)
                run_chromium(url, dump_dom=False, screenshot=shot, budget_ms=budget_ms)
            dom, console = run_chromium(url, budget_ms=budget_ms)
            probe = _probe(dom)
            where = f"{name!r} ({url})"
            problems += [f"{where}: console: {c}" for c in console if any(b in c for b in _BAD_CONSOLE)]
            if probe is None:
                what = ("asv's error.html (a script did not load)" if "continental origin" in dom
                        else f"a page without the probe:\n{dom[:1500]}")
                problems.append(f"{where}: chromium showed {what}")
                continue
            results[name] = PageResult(url, probe, console)
            problems += [f"{where}: JS error: {e}" for e in probe.get("errors", [])]
            if "error.html" in probe["href"] or not probe["jquery"]:
                problems.append(f"{where}: fell back to asv's error page (a script did not load)")
                continue
            if probe.get("error_message"):
                problems.append(f"{where}: asv error dialog: {probe['error_message']}")
            if name == "#/":
                missing = [b for b in benchmark_names if f"#{b}" not in probe.get("grid_links", [])]
                if missing:
                    problems.append(f"{where}: benchmarks missing from the grid: {missing}")
                continue
            points = sum(s["points"] for s in probe["series"])
            if not probe.get("graph_visible") or not probe.get("canvas"):
                problems.append(f"{where}: no flot canvas in #main-graph")
            elif points < min_points:
                problems.append(
                    f"{where}: graph plotted {points} data points (< {min_points}): {probe['series']}")
            if probe.get("title") != name:
                problems.append(f"{where}: page title is {probe.get('title')!r}")
    finally:
        server.shutdown()
        server.server_close()
    bad = sorted({f"{p} -> {s}" for _, p, s in server.requests if s is not None and s >= 400})
    problems += [f"server answered {b}" for b in bad]
    if screenshot_path and not Path(screenshot_path).is_file():
        problems.append(f"chromium wrote no screenshot to {screenshot_path}")
    if problems:
        raise SiteCheckError("published site check failed:\n  " + "\n  ".join(problems))
    return results


# --------------------------------------------------------------------------------------------------
# CLI


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
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
