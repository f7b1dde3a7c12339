"""Plain-text and Markdown tables without extra dependencies (the torch_xla venv has no pandas)."""

from __future__ import annotations


def cell(value, digits: int = 3) -> str:
    """A table cell: floats to ``digits`` significant digits, missing values (None, NaN) as ``-``."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def render(rows: list[dict], columns: list[str], *, markdown: bool = False) -> str:
    cells = [[str(row.get(c, "")) for c in columns] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in cells]
        return "\n".join(lines)
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*columns), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*r) for r in cells])
