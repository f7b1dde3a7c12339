"""The release matrix as a table: built from the filed cells, read back, drawn as a kernel x release
grid (status, and step time relative to the newest release). Reading never writes."""

from __future__ import annotations

import io

from attnbench.core.atomic import atomic_write_text
from attnbench.releases import matrix

# Imported where used: pandas (the torch_xla venv has no report libraries).

GRID_INDEX = ["framework", "target", "impl", "workload", "seq_len", "environment"]


def release_of(row: dict) -> str | None:
    """The row's framework version without a local build tag (``2.13.0+cpu`` is 2.13.0)."""
    version = row.get(row.get("framework") or "jax")
    return None if version is None or version != version else str(version).split("+")[0]


def matrix_frame(rows: list[dict]):
    """``matrix.COLUMNS`` frame of cell rows, with release, date and ``relative_to_newest``."""
    import pandas as pd

    dates = {(r.framework, r.version): r.date for r in matrix.RELEASES}
    frame = pd.DataFrame(rows)
    for column in matrix.COLUMNS:
        if column not in frame:
            frame[column] = None
    frame["release"] = [release_of(r) for r in frame.to_dict("records")]
    frame["environment"] = [environment_of(r) for r in frame.to_dict("records")]
    frame["release_date"] = [
        dates.get((f, v)) for f, v in zip(frame["framework"], frame["release"], strict=True)
    ]
    frame["relative_to_newest"] = relative_to_newest(frame)
    order = frame["release"].map(lambda v: matrix.version_key(str(v)))
    frame = frame.assign(_order=order).sort_values(
        ["framework", "target", "impl", "workload", "seq_len", "_order"]
    )
    return frame[matrix.COLUMNS].reset_index(drop=True)


def relative_to_newest(frame):
    """Per row: seconds per step over the newest timed release's of the same cell; None without times."""
    import pandas as pd

    seconds = pd.to_numeric(frame["seconds_per_step"], errors="coerce")
    out = []
    keys = [tuple(v) for v in frame[GRID_INDEX].astype(str).itertuples(index=False)]
    newest = {}
    for k, release, s in zip(keys, frame["release"], seconds, strict=True):
        if s == s and (
            k not in newest or matrix.version_key(str(release)) > matrix.version_key(str(newest[k][0]))
        ):
            newest[k] = (release, s)
    for k, s in zip(keys, seconds, strict=True):
        base = newest.get(k)
        out.append(None if base is None or s != s or not base[1] else round(float(s) / base[1], 3))
    return out


def write_table(frame, path: str) -> None:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    atomic_write_text(path, buffer.getvalue())


def load_table(path: str):
    import pandas as pd

    frame = pd.read_csv(path, dtype={"release": str, "jax": str, "jaxlib": str, "libtpu": str, "torch": str})
    missing = [c for c in ("framework", "release", "impl", "status") if c not in frame]
    if missing:
        raise ValueError(f"{path} is not a release-matrix table: no column {', '.join(missing)}")
    if "environment" not in frame:  # a table written before the companions and libtpu axis
        frame = frame.assign(environment=[environment_of(r) for r in frame.to_dict("records")])
    return frame


def cell_text(status: str, relative, cause: str | None = None) -> str:
    """``ok 1.04x``; a broken cell by its cause (``packaging``, ``adapter``, ``capability``,
    ``api-changed``, ``numerics``, ``unexplained``), never by the status its stage raised (an
    ``api-changed`` status is any import or attribute error); else the status."""
    if status == matrix.OK:
        return "ok" if relative != relative or relative is None else f"ok {relative:.2f}x"
    if status in matrix.BROKEN and cause is not None:
        return str(cause)
    return str(status)


def grid(frame):
    """Cell rows by release columns: ``ok 1.04x``, a broken cell's cause, or the status."""
    import pandas as pd

    causes = {_cell_id(b): b["cause"] for b in broken(frame)}
    text = [cell_text(r["status"], r["relative_to_newest"], causes.get(_cell_id(r)))
            for r in frame.to_dict("records")]
    table = frame.assign(cell=text, seq_len=frame["seq_len"].astype("Int64"))
    out = table.pivot_table(index=GRID_INDEX, columns="release", values="cell", aggfunc="first")
    columns = sorted(out.columns, key=lambda v: matrix.version_key(str(v)))
    return out[columns].fillna("-") if len(out) else pd.DataFrame()


def broken(frame) -> list[dict]:
    """Each cell that broke in some release, in upgrade order: kernel, where, environment, release,
    status, reason, and its ``cause`` with the ``evidence`` for it (``cause_of``)."""
    from attnbench.releases import api

    cells = []
    for _, part in _series(frame):
        seen = None  # (release, each name as the latest earlier release had it): a removal stays one
        for row in part:
            if row["status"] in matrix.BROKEN:
                cause, evidence = cause_of(row, seen, companion_of(frame, row))
                cells.append({**{c: row.get(c) for c in BROKEN_COLUMNS}, "cause": cause,
                              "evidence": evidence})
            present = {n: e for n, e in api.parse(row.get("api_surface")).items() if e.get("present")}
            if present:
                seen = (row["release"], {**(seen[1] if seen else {}), **present})
    return cells


def api_moves(frame) -> list[str] | None:
    """Every name or keyword a kernel's call passes that went between two neighbouring releases of
    the same cell, ok cells included (``api.moved``), in words; ``None`` for a table that recorded
    no surfaces (written before them)."""
    from attnbench.releases import api

    if "api_surface" not in frame or not frame["api_surface"].notna().any():
        return None
    out = []
    for _, part in _series(frame[frame["environment"] != "with companions"]):
        public, interpreter = _calls(str(part[0]["impl"]))
        for before, after in zip(part, part[1:], strict=False):
            for moved in api.moved({**public, **interpreter}, api.parse(before.get("api_surface")),
                                   api.parse(after.get("api_surface"))):
                out.append(f"{part[0]['impl']} {before['release']} -> {after['release']}: {moved}")
    return sorted(set(out))


BROKEN_COLUMNS = ["framework", "impl", "target", "environment", "workload", "seq_len", "release", "status",
                  "reason", "line"]


def breaks_to_cite(cells: list[dict]) -> list[dict]:
    """The breaks a verdict names as a kernel's fragility: in the environment ``pip install`` gives
    (``bare``), neither an older release's missing feature nor the project's adapter
    (``NOT_A_BREAKAGE``); a packaging cause says when the companions mend it."""
    out = []
    for cell in cells:
        if cell["environment"] != "bare" or cell["cause"] in NOT_A_BREAKAGE:
            continue
        mended = cell["cause"] == PACKAGING and "the same cell runs" in (cell["evidence"] or "")
        cause = "packaging: beside absl-py and chex it runs" if mended else cell["cause"]
        out.append({**cell, "cause": cause})
    return out


def _cell_id(row: dict) -> tuple:
    return (*(str(row[c]) for c in GRID_INDEX), str(row["release"]))
# Why a cell broke (docs/releases.md "Causes"): what an upgrade breaks (an upstream API), told apart
# from a release's packaging fault, a feature an older release lacks, and the project's own adapter.
API, PACKAGING, CAPABILITY, ADAPTER = "api-changed", "packaging", "capability", "adapter"
NUMERICS, UNEXPLAINED = "numerics", "unexplained"
# Known from the releases themselves and jax's history: pallas.tpu's absl import came in jax commit
# 4ec06d48fb and went in a96db3fc45 (first in 0.10.0); splash's head-dim limit went in c9a5799a2a.
UNDECLARED_IMPORTS = {"absl": "jax imports absl without declaring absl-py (0.9.2's pallas.tpu, and "
                              "jax._src.test_util, which Mosaic GPU attention imports, in every release); "
                              "pip install absl-py mends it"}
MISSING_FEATURES = {"should be a multiple of 128": "splash attention refuses a head dim that is not a "
                                                   "multiple of 128 before jax 0.7.1 (lifted in c9a5799a2a)"}


def environment_of(row: dict) -> str:
    """``bare`` (what ``pip install jax[tpu]==V`` gives), ``with companions`` (absl-py, chex), or
    ``libtpu V`` (a jax release compiling with another release's libtpu)."""
    if row.get("framework") == "jax":
        libtpu, jax = _text(row.get("libtpu")), _text(row.get("jax"))
        pinned = matrix.pinned_libtpu(jax) if jax else None
        if libtpu and libtpu != pinned and row.get("target") != "cpu":
            return f"libtpu {libtpu}"
        if _text(row.get("companions")) not in (None, "none"):
            return "with companions"
    return "bare"


def _text(value) -> str | None:
    return None if value is None or value != value or value == "" else str(value)


def _series(frame):
    """Each cell's rows in release order: ``(key, [row, ...])`` per kernel x target x workload x
    environment."""
    rows = frame.to_dict("records")
    series = {}
    for row in sorted(rows, key=lambda r: matrix.version_key(str(r["release"]))):
        series.setdefault(tuple(str(row[c]) for c in GRID_INDEX), []).append(row)
    return sorted(series.items())


def companion_of(frame, row: dict) -> dict | None:
    """The same cell of the same release beside the companions, for a bare jax cell."""
    if row.get("framework") != "jax" or row["environment"] != "bare":
        return None
    same = frame[(frame["impl"] == row["impl"]) & (frame["release"].astype(str) == str(row["release"]))
                 & (frame["target"] == row["target"]) & (frame["workload"] == row["workload"])
                 & (frame["seq_len"].astype(str) == str(row["seq_len"]))
                 & (frame["environment"] == "with companions")]
    return same.iloc[0].to_dict() if len(same) else None


def _calls(impl: str) -> tuple[dict, dict]:
    import attention_impls

    try:
        kernel = attention_impls.get(impl)
    except KeyError:  # a kernel the table names and this checkout no longer has
        return {}, {}
    return dict(kernel.public_calls), dict(kernel.interpreter_calls)


def cause_of(cell: dict, previous: tuple[str, dict] | None = None,
             companion: dict | None = None) -> tuple[str, str]:
    """``(cause, evidence)`` of a broken cell. ``previous``: ``(release, surface)`` of the same cell
    before it (the other side of an API comparison); ``companion``: the same cell beside absl-py and
    chex. In order:
    - ``numerics``: it ran and differs from float64;
    - ``packaging``: its error names a module the framework does not ship, or it runs a libtpu its
      jax does not pin; the companions' cell says whether installing them mends it;
    - ``adapter``: a name only the project's interpreter path uses is missing, the kernel's own are
      there;
    - ``api-changed``: a name or keyword the call uses was there in the release before and is not
      now (``api.moved``, read from the two releases' surfaces);
    - ``capability``: an older release lacks a feature the workload needs (known messages);
    - ``unexplained`` otherwise, with the error."""
    from attnbench.releases import api

    reason = str(cell.get("reason") or "")
    if cell.get("status") == matrix.NUMERICS_FAILED:
        return NUMERICS, reason[:200]
    module = api.not_shipped(reason)
    if module:
        known = UNDECLARED_IMPORTS.get(module.split(".")[0],
                                       f"the release imports {module} without declaring it")
        return PACKAGING, f"No module named '{module}': {known}" + _companion_words(companion)
    jax, libtpu = _text(cell.get("jax")), _text(cell.get("libtpu"))
    pinned = matrix.pinned_libtpu(jax) if jax else None
    if cell.get("framework") == "jax" and libtpu and cell.get("target") != "cpu" and libtpu != pinned:
        return PACKAGING, f"jax {jax} pins libtpu {pinned} (jax[tpu]); with libtpu {libtpu}: {reason[:160]}"
    public, interpreter = _calls(str(cell.get("impl")))
    surface = api.parse(cell.get("api_surface"))
    gone = [n for n in interpreter if n in surface and not surface[n].get("present")]
    if not surface:  # a table written before surfaces were recorded: the error names the switch
        gone = [n for n in interpreter if f"attribute '{n.rpartition(':')[2].split('.')[-1]}'" in reason]
    if gone and all(surface.get(n, {}).get("present", True) for n in public):
        return ADAPTER, (f"{', '.join(gone)} is not in this release: the project's way into the interpreter "
                         "on a CPU, never called on the kernel's own hardware; the kernel's own calls are "
                         "all here")
    if previous is not None:
        moved = api.moved({**public, **interpreter}, previous[1], surface)
        if moved:
            return API, f"from {previous[0]} to {cell.get('release')}: " + "; ".join(moved)[:300]
    for text, evidence in MISSING_FEATURES.items():
        if text in reason:
            return CAPABILITY, evidence
    return UNEXPLAINED, reason[:200]


def _companion_words(companion: dict | None) -> str:
    if companion is None:
        return ""
    if companion.get("status") == matrix.OK:
        return f"; beside {companion.get('companions')} the same cell runs"
    return f"; beside {companion.get('companions')} it is {companion.get('status')} too"


# -- the upgrade direction ------------------------------------------------------------------------
UPGRADE_COLUMNS = ["framework", "impl", "target", "workload", "seq_len", "environment", "from_release",
                   "to_release", "before", "after", "outcome", "cause", "evidence", "step_ratio"]


def upgrade_steps(frame):
    """The upgrade direction: for each cell, release N to N+1, one row per step in upgrade order.
    Every release runs the current call; it is the call as written for N too while no name or
    keyword it passes moved (``api_moves``; a test keeps the committed table at none, and a move
    would need the call as written before it, a per-release shim, which none has needed).
    ``outcome``: kept working, broke (with its cause), mended, newly runs (an older
    release's missing feature or the project's adapter before), still broken, or refused (the kernel
    refuses the cell here). ``step_ratio`` is the two one-shot step times' ratio, a hint only: what an
    upgrade did to speed is decided by paired rounds (``upgrade.py``). The libtpu axis has its own
    view (``libtpu_grid``)."""
    import pandas as pd

    causes = {_cell_id(b): (b["cause"], b["evidence"]) for b in broken(frame)}
    steps = []
    for _, rows in _series(frame):
        rows = [r for r in rows if not r["environment"].startswith("libtpu")]
        steps.extend(_step(before, after, causes) for before, after in zip(rows, rows[1:], strict=False))
    return pd.DataFrame(steps, columns=UPGRADE_COLUMNS)


# A break of these causes is not code that stopped working: an older release's missing feature, or the
# project's own path. The next release running the cell is "newly runs", not "mended".
NOT_A_BREAKAGE = (CAPABILITY, ADAPTER)


def _step(before: dict, after: dict, causes: dict) -> dict:
    ok_before, ok_after = before["status"] == matrix.OK, after["status"] == matrix.OK
    cause, evidence = causes.get(_cell_id(after), (None, None))
    ratio = None
    if ok_before and ok_after:
        outcome = "kept working"
        a, b = before.get("seconds_per_step"), after.get("seconds_per_step")
        if a == a and b == b and a and b:
            ratio = round(float(b) / float(a), 3)
    elif ok_before:
        outcome = "broke"
    elif ok_after:
        was = causes.get(_cell_id(before), (None,))[0]
        mended = before["status"] in matrix.BROKEN and was not in NOT_A_BREAKAGE
        outcome = "mended" if mended else "newly runs"
    elif after["status"] in matrix.BROKEN:
        outcome = "still broken" if before["status"] in matrix.BROKEN else "broken"
    else:
        outcome = "refused" if after["status"] == matrix.UNSUPPORTED else str(after["status"])
    where = ("framework", "impl", "target", "workload", "seq_len", "environment")
    return {**{c: before.get(c) for c in where},
            "from_release": before["release"], "to_release": after["release"], "before": before["status"],
            "after": after["status"], "outcome": outcome, "cause": cause, "evidence": evidence,
            "step_ratio": ratio}


def first_breaks(steps) -> list[dict]:
    """Per kernel, target and environment: the first upgrade that broke code working on the release
    before (``last_good`` -> ``first_bad``) with its cause, over every workload; kernels whose code
    never broke on an upgrade are left out."""
    broke = steps[steps["outcome"] == "broke"]
    out = []
    for (framework, impl, target, environment), part in broke.groupby(
            ["framework", "impl", "target", "environment"], sort=True):
        first = part.loc[part["to_release"].map(lambda v: matrix.version_key(str(v))).idxmin()]
        out.append({"framework": framework, "impl": impl, "target": target, "environment": environment,
                    "last_good": first["from_release"], "first_bad": first["to_release"],
                    "workload": first["workload"], "cause": first["cause"], "evidence": first["evidence"]})
    return out


def libtpu_grid(frame):
    """The TPU compiles of each jax release (rows, with the libtpu it pins) by libtpu (columns), in
    the venvs beside the companions: libtpu varied on its own, jax 0.9.2's undeclared absl aside."""
    import pandas as pd

    rows = [{"target": r["target"], "impl": r["impl"], "seq_len": int(r["seq_len"]),
             "jax": f"{r['release']} (pins {matrix.pinned_libtpu(str(r['release']))})",
             "libtpu": f"libtpu {r['libtpu']}", "cell": r["status"]}
            for r in frame[frame["target"] != "cpu"].to_dict("records")
            if _text(r.get("libtpu")) and _text(r.get("companions")) not in (None, "none")]
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows).pivot_table(index=["target", "impl", "seq_len", "jax"], columns="libtpu",
                                           values="cell", aggfunc="first")
    order = sorted(table.columns, key=lambda c: matrix.version_key(c.split()[-1]))
    return table[order].fillna("-")


def grid_markdown(frame) -> str:
    lines = []
    for framework in sorted(frame["framework"].dropna().unique()):
        part = grid(frame[frame["framework"] == framework])
        if part.empty:
            continue
        lines.append(f"### {framework}\n")
        lines.append(part.reset_index().to_markdown(index=False))
        lines.append("")
    return "\n".join(lines)
