"""Open a published site in headless chromium with the network cut, and check that its graphs plot.

A probe script, injected into ``index.html`` by the check's own server only, reports what the live
flot plot holds; DNS for every host but 127.0.0.1 is blackholed.
"""

from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

from .rewrite import external_references
from .serve import QuietHandler, serve

CHROMIUM_INSTALL_HINT = (
    "chromium not found (looked for $CHROMIUM, chromium, chromium-browser): `make test` installs it "
    "(apt-get install -y chromium)"
)


class SiteCheckError(AssertionError):
    """A published page did not render in chromium."""


PROBE_PATH = "/__attnbench_probe.js"
# Injected first thing in <head>: records errors, then (once flot has drawn) writes what the live
# plot holds into <pre id="attnbench-probe">, where --dump-dom shows it.
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


class _ProbeHandler(QuietHandler):
    def do_GET(self):
        path = urlsplit(self.path).path
        if path == PROBE_PATH:
            return self._send(PROBE_JS.encode(), "application/javascript")
        if path in ("/", "/index.html"):
            text = (Path(self.directory) / "index.html").read_text(encoding="utf-8")
            text = text.replace("<head>", f'<head><script src="{PROBE_PATH}"></script>', 1)
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


def _page_problems(where: str, name: str, probe: dict, benchmark_names: list[str],
                   min_points: int) -> list[str]:
    """What is wrong with one page's probe: the grid (``name == "#/"``) or a benchmark's graph."""
    problems = [f"{where}: JS error: {e}" for e in probe.get("errors", [])]
    if "error.html" in probe["href"] or not probe["jquery"]:
        return [*problems, f"{where}: fell back to asv's error page (a script did not load)"]
    if probe.get("error_message"):
        problems.append(f"{where}: asv error dialog: {probe['error_message']}")
    if name == "#/":
        missing = [b for b in benchmark_names if f"#{b}" not in probe.get("grid_links", [])]
        if missing:
            problems.append(f"{where}: benchmarks missing from the grid: {missing}")
        return problems
    points = sum(s["points"] for s in probe["series"])
    if not probe.get("graph_visible") or not probe.get("canvas"):
        problems.append(f"{where}: no flot canvas in #main-graph")
    elif points < min_points:
        problems.append(f"{where}: graph plotted {points} data points (< {min_points}): {probe['series']}")
    if probe.get("title") != name:
        problems.append(f"{where}: page title is {probe.get('title')!r}")
    return problems


def check_published_site(html_dir: str | os.PathLike, benchmark_names, screenshot_path=None, *,
                         budget_ms: int = 8000, min_points: int = 1) -> dict[str, PageResult]:
    """Open the grid and each benchmark's graph page of an offline published site in chromium.

    Raises :class:`SiteCheckError` listing every problem found; returns the probes by page name.
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
            problems += _page_problems(where, name, probe, benchmark_names, min_points)
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
