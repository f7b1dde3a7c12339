"""Point a published asv site at the vendored copies of its CDN files, and find what still is external."""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import vendor
from .vendor import URL_MAP, VENDOR_SUBDIR, OfflineHtmlError, copy_vendor

_TAG_RE = re.compile(r"<(script|link)\b[^>]*>", re.IGNORECASE)
_ATTR_RE = re.compile(r"""\b(src|href)\s*=\s*(["'])(.*?)\2""", re.IGNORECASE)
_SRI_RE = re.compile(r"""\s+(integrity|crossorigin|referrerpolicy)(\s*=\s*(["']).*?\3)?""", re.IGNORECASE)
_NOT_FETCHED_RE = re.compile(r"""\brel\s*=\s*["']?(alternate|canonical)""", re.IGNORECASE)
_EXTERNAL = re.compile(r"^(https?:)?//", re.IGNORECASE)
# In JS/CSS: a quoted or url()-wrapped external URL of a script, stylesheet or font.
_EXTERNAL_ASSET_RE = re.compile(
    r"""(?:["'(]|@import\s+)((?:https?:)?//[^"')\s]+?\.(?:m?js|css|woff2?|ttf|eot|svg|otf))(?:[?#][^"')\s]*)?["')]""",
    re.IGNORECASE,
)
_HTML = (".html", ".htm")


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
    vendor_dir = html_dir / VENDOR_SUBDIR
    for p in sorted(html_dir.rglob("*")):
        if p.is_file() and p.suffix.lower() in suffixes and vendor_dir not in p.parents:
            yield p


def external_references(html_dir: str | os.PathLike) -> list[tuple[Path, str]]:
    """(file, URL) of every external script/stylesheet/font the site would load.

    Skips ``rel=alternate``/``canonical`` links, which browsers do not fetch; scans the vendored CSS too.
    """
    html_dir = Path(html_dir)
    found = []
    for p in _site_files(html_dir, _HTML):
        for tag in _TAG_RE.finditer(p.read_text(encoding="utf-8", errors="replace")):
            m = _ATTR_RE.search(tag.group(0))
            if not m or not _EXTERNAL.match(m.group(3)):
                continue
            if tag.group(1).lower() == "link" and _NOT_FETCHED_RE.search(tag.group(0)):
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

    Raises :class:`OfflineHtmlError` if any external reference is left. Idempotent.
    Returns ``[(file, cdn_url, local_url), ...]``.
    """
    html_dir = Path(html_dir)
    if not (html_dir / "index.html").is_file():
        raise OfflineHtmlError(f"{html_dir} has no index.html: run `asv publish` first")
    copy_vendor(html_dir, vendor_dir)

    done: list = []
    for p in _site_files(html_dir, (*_HTML, ".js", ".css")):
        text = p.read_text(encoding="utf-8")
        if p.suffix.lower() in _HTML:
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
            f"{vendor.__name__}):\n{listing}"
        )
    return done
