"""The CDN files of asv 0.6.6's pages, fetched once from npm into a vendor cache.

:data:`URL_MAP` maps each CDN URL to a file of an npm package (:data:`PACKAGES`) and to the path
it gets under ``<html_dir>/vendor/``; :func:`fetch_vendor` fills the cache with ``npm pack``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
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


class OfflineHtmlError(RuntimeError):
    """The site still references the internet, or the vendor files cannot be had."""


def _pkg_dir(cache_dir: Path, name: str) -> Path:
    return cache_dir / f"{name}-{PACKAGES[name]}" / "package"


def _needed_files(name: str) -> list[str]:
    files = [src for pkg, src, _ in URL_MAP.values() if pkg == name]
    files += [d for pkg, d, _ in EXTRA_DIRS if pkg == name]
    return files


def fetch_vendor(cache_dir: str | os.PathLike | None = None) -> Path:
    """Fill ``cache_dir`` (default ``.asv/vendor``) with the npm packages of :data:`PACKAGES`.

    Packages already there are skipped, so this is cheap to call before every publish.
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
            shutil.rmtree(dest, ignore_errors=True)  # staged first: a failed fetch leaves no half package
            staging.rename(dest)
    return cache


def copy_vendor(html_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    """Copy the vendored files from the cache to ``<html_dir>/vendor/``; return that directory."""
    cache = fetch_vendor(cache_dir)
    out = Path(html_dir) / VENDOR_SUBDIR
    for pkg, src, dst in URL_MAP.values():
        (out / dst).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_pkg_dir(cache, pkg) / src, out / dst)
    for pkg, src, dst in EXTRA_DIRS:
        shutil.copytree(_pkg_dir(cache, pkg) / src, out / dst, dirs_exist_ok=True)
    return out
