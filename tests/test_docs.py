"""The documentation holds together: a short README, links that resolve, every variable documented.

The README is the entry point and stays short; the rest lives in docs/ (plain Markdown, indexed by
docs/README.md) and the measurement log in results/LOG.md. Each check is a function over files, run
on the repository and, to show it can fail, on a small broken copy in a temporary folder.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
# Where the code reads or sets ATTNBENCH_* variables (tests/ documents its own two as well).
CODE_PLACES = ("attnbench", "benchmarks", "attention_impls", "tools", "Makefile")
ENV_NAME = re.compile(r"ATTNBENCH_[A-Z0-9_]+")
# ](target): an inline link or image; the target ends at whitespace or ")".
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")


def markdown_files(root: Path = ROOT) -> list[Path]:
    """The README, every docs page, and results/' log and READMEs (where they exist)."""
    results = [root / "results" / "LOG.md", root / "results" / "README.md",
               *sorted((root / "results").glob("*/README.md"))]
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *(p for p in results if p.exists())]


def _outside_code(text: str) -> str:
    """The text with fenced code blocks and inline code spans blanked (links there are not links)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # keeps letters, digits, '_', '-' and spaces
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        if fenced:
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(path: Path) -> list[str]:
    """Relative links of ``path`` whose file does not exist, or whose #anchor is no heading there."""
    problems = []
    for target in LINK.findall(_outside_code(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.name}: {target} (no such file)")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{path.name}: {target} (no heading #{anchor} in {dest.name})")
    return problems


def env_names_in_code(root: Path = ROOT) -> set[str]:
    names = set()
    for place in CODE_PLACES:
        base = root / place
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for p in files:
            if "__pycache__" in p.parts:
                continue
            names |= set(ENV_NAME.findall(p.read_text(errors="ignore")))
    return names


def undocumented_env_names(root: Path = ROOT) -> set[str]:
    documented = set(ENV_NAME.findall((root / "docs" / "environment.md").read_text()))
    return env_names_in_code(root) - documented


def readme_lines(root: Path = ROOT) -> int:
    return len((root / "README.md").read_text().splitlines())


def unindexed_pages(root: Path = ROOT) -> set[str]:
    docs = root / "docs"
    linked = {t.partition("#")[0] for t in LINK.findall(_outside_code((docs / "README.md").read_text()))}
    return {p.name for p in docs.glob("*.md") if p.name != "README.md"} - linked


def undocumented_commands(commands: set[str], cli_md: Path = ROOT / "docs" / "cli.md") -> set[str]:
    """``commands`` that docs/cli.md's "Every `attnbench` command" table has no row for."""
    table = cli_md.read_text().split("## Every `attnbench` command", 1)[-1].split("\n## ", 1)[0]
    rows = {m.group(1) for m in re.finditer(r"^\| `([a-z][a-z-]*)[ `]", table, re.MULTILINE)}
    return commands - rows


def parser_commands() -> set[str]:
    """The subcommands ``python -m attnbench`` takes (its parser's)."""
    import argparse

    from attnbench.cli import build_parser

    actions = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(actions[0].choices)


# -- the repository ----------------------------------------------------------------------------------

def test_readme_is_short():
    lines = readme_lines()
    limit = README_MAX_LINES
    assert lines <= limit, f"README.md has {lines} lines (at most {limit}): move text to docs/"


def test_every_relative_link_resolves():
    problems = [p for path in markdown_files() for p in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_attnbench_variable_is_documented():
    names = env_names_in_code()
    assert len(names) >= 15, f"found only {sorted(names)}: is the search looking in the right places?"
    missing = undocumented_env_names()
    assert not missing, f"not in docs/environment.md: {sorted(missing)}"


def test_every_attnbench_command_has_a_row_in_cli_md():
    commands = parser_commands()
    assert {"run", "report", "tune-targets"} <= commands
    missing = undocumented_commands(commands)
    assert not missing, f"docs/cli.md's command table has no row for {sorted(missing)}"


def test_the_docs_index_links_every_page():
    missing = unindexed_pages()
    assert not missing, f"docs/README.md does not link {sorted(missing)}"


# -- each check fails where it should -----------------------------------------------------------------

def _tree(tmp_path: Path, readme: str, docs: dict[str, str], code: str = "") -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)
    for name, text in docs.items():
        (tmp_path / "docs" / name).write_text(text)
    (tmp_path / "attnbench").mkdir()
    (tmp_path / "attnbench" / "mod.py").write_text(code)
    return tmp_path


def test_slug_is_githubs():
    assert slug("Your own Python: `ENV=existing`") == "your-own-python-envexisting"
    assert slug("The verdict (on the committed results)") == "the-verdict-on-the-committed-results"
    assert slug("Where the user's hardware is") == "where-the-users-hardware-is"
    assert slug("torch_xla") == "torch_xla"


def test_a_missing_file_or_heading_is_a_broken_link(tmp_path):
    root = _tree(tmp_path, "[a](docs/a.md#there) [b](docs/gone.md) [c](docs/a.md#nowhere) [w](https://x.y/z)\n"
                 "`[d](not/a/link.md)`\n", {"a.md": "# A\n\n## There\n\n[up](../README.md)\n"})
    problems = broken_links(root / "README.md")
    assert problems == ["README.md: docs/gone.md (no such file)",
                        "README.md: docs/a.md#nowhere (no heading #nowhere in a.md)"]
    assert broken_links(root / "docs" / "a.md") == []


def test_an_undocumented_variable_is_found(tmp_path):
    root = _tree(tmp_path, "", {"environment.md": "| `ATTNBENCH_SUITE` | ... |\n"},
                 code='os.environ.get("ATTNBENCH_SUITE"), os.environ.get("ATTNBENCH_NEW_KNOB")\n')
    assert undocumented_env_names(root) == {"ATTNBENCH_NEW_KNOB"}


def test_a_page_missing_from_the_index_is_found(tmp_path):
    root = _tree(tmp_path, "", {"README.md": "- [a.md](a.md)\n", "a.md": "# A\n", "b.md": "# B\n"})
    assert unindexed_pages(root) == {"b.md"}


def test_a_long_readme_is_counted(tmp_path):
    root = _tree(tmp_path, "line\n" * (README_MAX_LINES + 1), {})
    assert readme_lines(root) == README_MAX_LINES + 1 > README_MAX_LINES


def test_a_command_missing_from_cli_md_is_found(tmp_path):
    page = tmp_path / "cli.md"
    page.write_text("# CLI\n\n## Every `attnbench` command\n\n| command | what |\n|---|---|\n"
                    "| `list` | kernels |\n| `cases FOLDER` | records |\n\n## Other entry points\n\n"
                    "| `tune` | not in the table |\n")
    assert undocumented_commands({"list", "cases", "tune"}, page) == {"tune"}
