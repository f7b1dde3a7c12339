"""The offline asv site: a tiny asv project published, vendored, served on loopback, opened in chromium.

Needs chromium (`make test` installs it: apt-get install -y chromium) and, once, npm to fill the
vendor cache (.asv/vendor). Neither missing is a skip: the test fails saying what to install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from attnbench import offline_html as oh

pytestmark = pytest.mark.browser

REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO_ROOT / "artifacts" / "offline_html_track.png"
TRACK = "bench.TrackSuite.track_flops"
TIME = "bench.time_sum"

ASV_CONF = {
    "version": 1, "project": "tiny", "project_url": "http://example.invalid/", "repo": ".",
    "branches": ["main"], "environment_type": "existing", "benchmark_dir": "benchmarks",
    "results_dir": "results", "html_dir": "html", "env_dir": ".asv/env",
}
BENCH = textwrap.dedent("""
    SCALE = {scale}

    class TrackSuite:
        params = [[1, 2, 4]]
        param_names = ["n"]

        def track_flops(self, n):
            return SCALE * n
        track_flops.unit = "GFLOP/s"

    def time_sum():
        sum(range(1000))
""")


def _run(cmd, cwd, env):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    out = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{out}"
    return proc.stdout


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A 2-commit git repo with a 2-benchmark asv suite, run per commit and published."""
    tmp = tmp_path_factory.mktemp("asvsite")
    proj = tmp / "proj"
    (proj / "benchmarks").mkdir(parents=True)
    env = {**os.environ, "HOME": str(tmp),  # asv machine writes ~/.asv-machine.json
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1"}
    (proj / "asv.conf.json").write_text(json.dumps(ASV_CONF))
    (proj / "benchmarks" / "__init__.py").write_text("")
    _run(["git", "init", "-q", "-b", "main"], proj, env)
    shas = []
    for scale in (10.0, 15.0):
        (proj / "benchmarks" / "bench.py").write_text(BENCH.format(scale=scale))
        _run(["git", "add", "-A"], proj, env)
        _run(["git", "commit", "-qm", f"scale {scale}"], proj, env)
        shas.append(_run(["git", "rev-parse", "HEAD"], proj, env).strip())
    asv = [sys.executable, "-m", "asv"]
    _run([*asv, "machine", "--yes", "--machine", "test-machine"], proj, env)
    for sha in shas:  # existing mode benchmarks the working tree: check each commit out first
        _run(["git", "checkout", "-q", sha], proj, env)
        _run([*asv, "run", "--python=same", "--quick", "--machine", "test-machine",
              "--set-commit-hash", sha], proj, env)
    _run(["git", "checkout", "-q", "main"], proj, env)
    _run([*asv, "publish"], proj, env)
    shutil.copytree(proj / "html", tmp / "html-stock")  # as asv wrote it, for the negative tests
    return proj / "html"


def test_chromium_installed():
    try:
        oh.find_chromium()
    except oh.SiteCheckError as e:
        pytest.fail(str(e))


def test_published_site_renders_offline(published):
    try:
        oh.find_chromium()
    except oh.SiteCheckError as e:
        pytest.fail(str(e))
    assert oh.external_references(published), "stock asv publish should reference CDNs"
    done = oh.make_offline(published)
    assert {url for _, url, _ in done} == set(oh.URL_MAP)
    assert oh.make_offline(published) == []  # idempotent
    assert not oh.external_references(published)

    SCREENSHOT.unlink(missing_ok=True)
    res = oh.check_published_site(published, [TRACK, TIME], SCREENSHOT)
    track = res[TRACK].probe
    assert [s["points"] for s in track["series"]] == [2, 2, 2]  # n=1,2,4 x 2 commits
    assert track["legend"] == ["n-1", "n-2", "n-4"]
    assert [s["points"] for s in res[TIME].probe["series"]] == [2]
    assert sorted(res["#/"].probe["grid_links"]) == sorted([f"#{TRACK}", f"#{TIME}"])
    assert SCREENSHOT.stat().st_size > 10_000


def test_check_fails_on_the_stock_site(published):
    """Without make_offline the page falls back to asv's error.html (chromium resolves no CDN)."""
    stock = published.parent.parent / "html-stock"
    with pytest.raises(oh.SiteCheckError, match=r"(?s)external reference https://code\.jquery.*error\.html"):
        oh.check_published_site(stock, [TRACK])


def test_check_fails_without_vendor_files(published, tmp_path):
    site = tmp_path / "html"
    shutil.copytree(published.parent.parent / "html-stock", site)
    oh.make_offline(site)
    shutil.rmtree(site / "vendor" / "flot-0.8.3")
    missing = r"(?s)error\.html.*/vendor/flot-0\.8\.3/jquery\.flot\.js -> 404"
    with pytest.raises(oh.SiteCheckError, match=missing):
        oh.check_published_site(site, [TRACK])


def test_unknown_cdn_reference_is_named(published, tmp_path):
    site = tmp_path / "html"
    shutil.copytree(published.parent.parent / "html-stock", site)
    page = site / "index.html"  # a stock page plus one CDN script not in URL_MAP
    page.write_text(page.read_text().replace(
        "</head>", '<script src="https://cdn.example.com/x.js"></script></head>'))
    with pytest.raises(oh.OfflineHtmlError, match=r"index\.html: https://cdn\.example\.com/x\.js"):
        oh.make_offline(site)


def test_serve_is_loopback_only(published):
    server = oh.serve(published)
    try:
        host, port = server.server_address
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.json", timeout=10) as r:
            assert json.load(r)["project"] == "tiny"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_vendor_is_idempotent_and_names_npm(monkeypatch, tmp_path):
    cache = oh.fetch_vendor()  # filled already by make_offline; must not need npm now
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert oh.fetch_vendor(cache) == cache
    with pytest.raises(oh.OfflineHtmlError, match="npm is not installed"):
        oh.fetch_vendor(tmp_path / "empty-cache")
