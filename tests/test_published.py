"""The published table (``attnbench/published``): Tokamax's autotuning caches read as rows.

Every fixture is a small cache file this test writes itself, with expected values worked out by hand;
one test reads the vendored repository copy (``attnbench/published/data/``) and checks it against its
README. Nothing here reads ``results/`` or imports tokamax.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from attnbench.published import cli, table
from attnbench.published import tokamax_caches as tc
from attnbench.published.tokamax_caches import PublishedError

ROOT = Path(__file__).resolve().parents[1]
MS = [2.0, 1.0, 3.0, 5.0, 4.0]  # median 3, min 1, max 5: spread (5 - 1) / 3


def key(q="bf16[2,8,4,16]", k="bf16[2,8,2,16]", v=None, *, causal=False, bool_mask=None, bias=None,
        residuals=False, vjp=False) -> str:
    """An argument-spec key as tokamax writes it (``vjp`` adds the backward's fields)."""
    spec = {"q": q, "k": k, "v": v or k, "precision": [["DEFAULT", "DEFAULT"], ["DEFAULT", "DEFAULT"]],
            "logits_dtype": "float32", "logits_scale": 0.25, "bias": bias, "logits_soft_cap": None,
            "mask": {"bool_mask": bool_mask, "q_start": None, "q_end": None, "k_start": None, "k_end": None,
                     "is_causal": causal},
            "dropout_mask": None, "dropout_rate": 0.0, "paging_info": None, "q_indices": None,
            "k_indices": None, "normalize_output": True, "return_residuals": residuals}
    if vjp:
        spec = {"residuals": ["f32[2,4,8]", "f32[2,4,8]"], "out": q, "dout": q} | spec
    return json.dumps(spec, separators=(",", ":"))


def result(times=MS, *, peak=None, peak_in_metadata=False, **extra) -> dict:
    out = {"compile_time_ms": 100.5, "lower_time_ms": 10.25, "evaluation_times_ms": times, "metadata": {}}
    if peak is not None and peak_in_metadata:
        out["metadata"]["peak_memory_mb"] = peak
    elif peak is not None:
        out["peak_memory_mb"] = peak
    return out | extra


def write_cache(path: Path, entries: dict | str | bytes) -> Path:
    """A cache file: a dict as JSON, text or bytes as given; ``.gz`` compressed."""
    data = entries if isinstance(entries, bytes) else (
        entries if isinstance(entries, str) else json.dumps(entries)).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def read(path: Path, op="dot_product_attention", device_kind="tpu_v5") -> list[dict]:
    source_file = f"tokamax/data/autotuning/{device_kind}/x.json"
    return tc.read_cache_file(path, source="test", source_file=source_file, source_url="",
                              device_kind=device_kind, op=op)


# ------------------------------------------------------------------------ shapes


@pytest.mark.parametrize("text, dtype, dims", [
    ("bf16[32,4096,8,128]", "bfloat16", (32, 4096, 8, 128)),
    ("f16[1,128,1792,4,32]", "float16", (1, 128, 1792, 4, 32)),
    ("f32[7]", "float32", (7,)),
    ("f8e4m3fn[2,3]", "f8e4m3fn", (2, 3)),
])
def test_a_shape_string_reads_as_dtype_and_dims(text, dtype, dims):
    assert tc.parse_shape(text) == tc.Shape(dtype, dims)


@pytest.mark.parametrize("text", ["bf16[32,x]", "bf16", "[1,2]", "bf16[1,2", "bf16[1,,2]", None, 3])
def test_a_malformed_shape_string_is_refused(text):
    with pytest.raises(PublishedError, match=r"is not dtype\[d0,d1,...\]"):
        tc.parse_shape(text)


# ------------------------------------------------------------------------ entries


def test_fields_of_a_gqa_causal_entry_with_two_leading_batch_dims(tmp_path):
    path = write_cache(tmp_path / "a.json", {
        key("bf16[2,3,128,8,64]", "bf16[2,3,128,2,64]", causal=True): {"{}": result(peak=12.5)}})
    [row] = read(path)
    assert list(row) == table.COLUMNS
    assert (row["batch"], row["q_heads"], row["kv_heads"], row["seq_q"], row["seq_k"]) == (6, 8, 2, 128, 128)
    assert (row["head_dim"], row["head_dim_v"], row["dtype"]) == (64, 64, "bfloat16")
    assert row["causal"] is True and row["mask"] == "causal" and row["pass"] == "fwd"
    assert row["precision"] == "DEFAULT" and row["config"] == "{}" and row["peak_memory_mb"] == 12.5
    assert (row["evidence"], row["device"], row["hardware_profile"], row["target"]) == (
        "published", "TPU v5p", "tpu-v5p", "tpu-v5p")
    assert (row["op"], row["kernel"], row["implementation"]) == ("dot_product_attention", "jax-tokamax-xla",
                                                                 "xla")


def test_flops_and_tflops_by_hand(tmp_path):
    """B2 Hq4 Hkv2 S8 D16. Causal keeps 8*9/2 = 36 pairs a sequence, 72 in all: fwd = 4*16*4*72 = 18432;
    the vjp's share is 2.5x that, 46080; non-causal keeps 2*64 = 128 pairs: 4*16*4*128 = 32768. The
    median is 3 ms: 18432 / 3e-3 / 1e12 TFLOP/s."""
    path = write_cache(tmp_path / "fwd.json", {
        key(causal=True): {"{}": result()},
        key(causal=False): {"{}": result()},
        key(causal=True, residuals=True): {"{}": result()},
    })
    causal, full, residuals = read(path)
    assert causal["flops"] == 18432 and full["flops"] == 32768 and residuals["flops"] == 18432
    assert residuals["pass"] == "fwd_residuals"
    assert causal["tflops_per_s"] == pytest.approx(18432 / 3e-3 / 1e12, rel=1e-12)
    assert (causal["median_ms"], causal["min_ms"], causal["max_ms"], causal["n_evaluations"]) == (3, 1, 5, 5)
    assert causal["spread"] == pytest.approx(4 / 3)
    assert (causal["compile_ms"], causal["lower_ms"]) == (100.5, 10.25)
    vjp_path = write_cache(tmp_path / "vjp.json", {key(causal=True, vjp=True): {"{}": result()}})
    [vjp] = read(vjp_path, op="dot_product_attention_vjp")
    assert vjp["pass"] == "vjp" and vjp["op"] == "dot_product_attention"
    assert vjp["flops"] == 46080 and vjp["tflops_per_s"] == pytest.approx(46080 / 3e-3 / 1e12)
    assert "backward's share" in vjp["note"]


def test_a_bool_mask_and_bias_are_named_and_get_no_flops(tmp_path):
    path = write_cache(tmp_path / "m.json", {
        key("bf16[384,384,4,32]", "bf16[384,384,4,32]", bool_mask="bool[384,1,1,384]",
            bias="bf16[1,4,384,384]"): {"{}": result()},
        key(bias="bf16[1,4,8,8]"): {"{}": result()},
        key(causal=True, bool_mask="bool[2,1,1,8]"): {"{}": result()},
    })
    both, bias, causal_bool = read(path)
    assert both["mask"] == "bool[384,1,1,384] + bias bf16[1,4,384,384]"
    assert bias["mask"] == "bias bf16[1,4,8,8]"
    assert causal_bool["mask"] == "causal + bool[2,1,1,8]"
    for row in (both, bias, causal_bool):
        assert row["flops"] is None and row["tflops_per_s"] is None
        assert "no FLOPs: a bool mask or bias" in row["note"]


def test_a_different_value_head_dim_or_an_unknown_dtype_gets_no_flops_and_says_why(tmp_path):
    path = write_cache(tmp_path / "d.json", {
        key("bf16[2,8,4,16]", "bf16[2,8,4,16]", "bf16[2,8,4,32]"): {"{}": result()},
        key("f8e4m3fn[2,8,4,16]", "f8e4m3fn[2,8,4,16]"): {"{}": result()},
        key("bf16[2,8,3,16]", "bf16[2,8,2,16]"): {"{}": result()},  # 2 kv heads do not divide 3
    })
    head_dim_v, fp8, uneven = read(path)
    assert head_dim_v["head_dim_v"] == 32 and head_dim_v["flops"] is None
    assert head_dim_v["note"] == "no FLOPs: head_dim 16 != head_dim_v 32"
    assert fp8["dtype"] == "f8e4m3fn" and fp8["flops"] is None and "f8e4m3fn" in fp8["note"]
    assert uneven["flops"] is None and "kv_heads must divide q_heads" in uneven["note"]


def test_peak_memory_is_read_at_the_top_or_in_the_metadata_or_left_empty(tmp_path):
    path = write_cache(tmp_path / "p.json", {key(): {
        '{"block":1}': result(peak=1.5), '{"block":2}': result(peak=2.5, peak_in_metadata=True),
        '{"block":3}': result()}})
    assert [r["peak_memory_mb"] for r in read(path)] == [1.5, 2.5, None]
    assert [r["config"] for r in read(path)] == ['{"block":1}', '{"block":2}', '{"block":3}']


def test_the_jax_nn_op_is_the_cudnn_kernel_with_its_note(tmp_path):
    path = write_cache(tmp_path / "j.json", {key(causal=True): {"{}": result()}})
    [row] = read(path, op="jax_nn_dot_product_attention", device_kind="nvidia_h100_80gb_hbm3")
    assert (row["kernel"], row["implementation"], row["hardware_profile"]) == (
        "jax-tokamax-cudnn", "cudnn", "h100-sxm")
    assert "does not record which jax.nn implementation ran" in row["note"]


def test_keys_without_a_result_and_empty_files_give_no_rows_and_are_counted(tmp_path):
    data = tmp_path / "caches"
    write_cache(data / "tpu7x" / "dot_product_attention.json",
                {key(): {}, key(causal=True): {"{}": result()}})
    write_cache(data / "tpu7x" / "pallas_mosaic_tpu_flash_attention.json", b"")
    write_cache(data / "tpu7x" / "pallas_mosaic_tpu_flash_attention_vjp.json.gz", b"")
    write_cache(data / "tpu7x" / "ragged_dot.json", {"not": "attention"})  # not an attention op: not read
    reading = tc.read_source(tc.Source("test", data, "caches"))
    assert len(reading.rows) == 1 and reading.files == 3 and reading.without_result == 1
    assert reading.empty_files == ("tokamax/data/autotuning/tpu7x/pallas_mosaic_tpu_flash_attention.json",
                                   "tokamax/data/autotuning/tpu7x/pallas_mosaic_tpu_flash_attention_vjp.json")
    assert read(data / "tpu7x" / "pallas_mosaic_tpu_flash_attention.json") == []


def test_a_source_reads_gzip_names_its_files_and_keeps_an_unknown_device(tmp_path):
    data = tmp_path / "caches"
    write_cache(data / "tpu_v9_ultra" / "pallas_mosaic_tpu_flash_attention.json.gz",
                {key(causal=True): {'{"block_q":128}': result()}})
    source = tc.Source("repo@abc", data, "caches", url="https://example.org/blob/abc/")
    [row] = tc.read_source(source).rows
    assert row["source_file"] == "tokamax/data/autotuning/tpu_v9_ultra/pallas_mosaic_tpu_flash_attention.json"
    assert row["source_url"] == "https://example.org/blob/abc/" + row["source_file"]
    assert (row["device_kind"], row["device"], row["hardware_profile"], row["target"]) == (
        "tpu_v9_ultra", "tpu_v9_ultra", "", "")
    assert row["kernel"] == "jax-tokamax-mosaic-tpu" and row["source"] == "repo@abc"


def test_without_tokamax_the_wheel_source_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setattr(tc.importlib.util, "find_spec", lambda name: None)
    source = tc.wheel_source()
    assert source.data_dir is None and "tokamax is not installed" in source.missing
    reading = tc.read_source(source)
    assert reading.rows == () and reading.files == 0
    assert tc.published_rows([source]).empty and list(tc.published_rows([source]).columns) == table.COLUMNS


# ------------------------------------------------------------------------ bad input: one line each

BAD = {
    "malformed shape": ({key("bf16[32,x]"): {"{}": result()}},
                        r"q shape 'bf16\[32,x\]' is not dtype\[d0,d1,...\]"),
    "too few dims": ({key("bf16[8,16]"): {"{}": result()}}, r"q shape 'bf16\[8,16\]' has 2 dims"),
    "missing times": ({key(): {"{}": {"compile_time_ms": 1.0}}}, "evaluation_times_ms is missing"),
    "empty times": ({key(): {"{}": result([])}}, "evaluation_times_ms is empty"),
    "non-numeric times": ({key(): {"{}": result([1.0, "fast"])}}, "evaluation_times_ms has 'fast'"),
    "boolean time": ({key(): {"{}": result([True])}}, "evaluation_times_ms has True"),
    "key not JSON": ({'{"q": bf16': {"{}": result()}}, "the key is not JSON"),
    "config not JSON": ({key(): {"{block": result()}}, "the config is not JSON"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_each_bad_entry_is_one_line_naming_the_file_and_the_entry(tmp_path, name):
    entries, message = BAD[name]
    path = write_cache(tmp_path / "x.json", entries)
    with pytest.raises(PublishedError) as caught:
        read(path, device_kind="tpu7x")
    text = str(caught.value)
    entry = next(iter(entries))
    assert "\n" not in text
    assert text.startswith(f"tokamax/data/autotuning/tpu7x/x.json: entry '{entry[:80]}")
    assert re.search(message, text), text


def test_an_entry_is_quoted_to_80_characters():
    text = key("bf16[32,x]")
    with pytest.raises(PublishedError) as caught:
        tc.parse_spec(text, f"f.json: entry {tc._short(text)}", vjp=False)
    assert str(caught.value).startswith(f"f.json: entry '{text[:80]}...': q shape")


@pytest.mark.parametrize("content, message", [
    (b'{"a": ', "the file is not JSON: Expecting value"),
    (b"[1, 2]", "the file is not a JSON object"),
    (b"\xff\xfe", "cannot be read"),
])
def test_a_file_that_is_not_a_json_object_is_one_line_naming_it(tmp_path, content, message):
    path = write_cache(tmp_path / "x.json", content)
    with pytest.raises(PublishedError) as caught:
        read(path, device_kind="tpu7x")
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("tokamax/data/autotuning/tpu7x/x.json: ")
    assert message in str(caught.value)


def test_an_error_in_a_source_names_the_file_there(tmp_path):
    data = tmp_path / "caches"
    write_cache(data / "tpu_v5" / "dot_product_attention.json.gz", b"{oops")
    with pytest.raises(PublishedError,
                       match=r"^caches/tpu_v5/dot_product_attention\.json\.gz: the file is not JSON"):
        tc.read_source(tc.Source("test", data, "caches"))


# ------------------------------------------------------------------------ the CSV


def frame_of(tmp_path) -> pd.DataFrame:
    data = tmp_path / "caches"
    write_cache(data / "tpu_v5" / "dot_product_attention.json", {
        key(causal=True): {"{}": result([0.1, 0.3, 0.2], peak=1.0)},
        key(bool_mask="bool[2,1,1,8]"): {"{}": result()}})
    write_cache(data / "nvidia_h100_80gb_hbm3" / "pallas_triton_flash_attention.json",
                {key(): {'{"block_q":64}': result(), '{"block_q":32}': result([1 / 3])}})
    return tc.published_rows([tc.Source("test", data, "caches")])


def test_the_csv_is_sorted_has_every_column_and_reads_back(tmp_path):
    frame = frame_of(tmp_path)
    path = tmp_path / "out" / "tokamax.csv"
    table.write_csv(frame, str(path))
    text = path.read_text()
    assert text.splitlines()[0] == ",".join(table.COLUMNS)
    back = table.read_csv(str(path))
    assert list(back.columns) == table.COLUMNS and len(back) == 4
    assert list(back["device_kind"]) == ["nvidia_h100_80gb_hbm3"] * 2 + ["tpu_v5"] * 2
    assert list(back["config"][:2]) == ['{"block_q":32}', '{"block_q":64}']
    assert back["median_ms"][0] == pytest.approx(1 / 3, rel=1e-9) and "0.3333333333," in text
    causal = back[back["causal"]].iloc[0]
    assert causal["flops"] == 18432 and causal["mask"] == "causal" and causal["note"] == ""
    masked = back[back["mask"] == "bool[2,1,1,8]"].iloc[0]
    assert pd.isna(masked["flops"]) and masked["note"].startswith("no FLOPs")
    assert (back["source_url"] == "").all()


def test_the_csv_does_not_depend_on_row_order_and_rewrites_itself_unchanged(tmp_path):
    frame = frame_of(tmp_path)
    text = table.csv_text(frame)
    assert table.csv_text(frame.iloc[::-1].reset_index(drop=True)) == text
    path = tmp_path / "tokamax.csv"
    table.write_csv(frame, str(path))
    assert table.csv_text(table.read_csv(str(path))) == text


def test_a_failure_mid_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "tokamax.csv"
    path.write_text("the old file\n")

    def fail(_fd):
        raise OSError("disk full")

    monkeypatch.setattr("attnbench.core.atomic.os.fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        table.write_csv(frame_of(tmp_path), str(path))
    assert path.read_text() == "the old file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["caches", "tokamax.csv"]  # no temp file left


def test_read_csv_never_modifies_the_file(tmp_path):
    path = tmp_path / "tokamax.csv"
    table.write_csv(frame_of(tmp_path), str(path))
    before = (path.read_bytes(), os.stat(path).st_mtime_ns)
    table.read_csv(str(path))
    assert (path.read_bytes(), os.stat(path).st_mtime_ns) == before
    short = tmp_path / "short.csv"
    short.write_text("evidence,source,median_ms\npublished,x,1\n")
    before = (short.read_bytes(), os.stat(short).st_mtime_ns)
    with pytest.raises(PublishedError) as caught:
        table.read_csv(str(short))
    assert str(caught.value).startswith(f"{short}: missing columns source_file, source_url, device_kind")
    assert "\n" not in str(caught.value)
    assert (short.read_bytes(), os.stat(short).st_mtime_ns) == before


def test_read_csv_of_no_file_says_what_writes_it(tmp_path):
    with pytest.raises(PublishedError, match="no such file"):
        table.read_csv(str(tmp_path / "none.csv"))
    assert not (tmp_path / "none.csv").exists()


# ------------------------------------------------------------------------ the command


def parse(argv):
    parser = argparse.ArgumentParser(prog="attnbench")
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_the_command_writes_then_checks(tmp_path, monkeypatch, capsys):
    data = tmp_path / "caches"
    write_cache(data / "tpu_v5" / "dot_product_attention.json",
                {key(): {"{}": result()}, key(causal=True): {}})
    write_cache(data / "tpu7x" / "dot_product_attention.json", {key(): {"{}": result()}})
    monkeypatch.setattr(tc, "read_sources", lambda: [tc.read_source(tc.Source("test", data, "caches"))])
    out = tmp_path / "published" / "tokamax.csv"
    args = parse(["published", "--out", str(out)])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["TPU7x (Ironwood) (tpu7x): 1 rows (test 1)", "TPU v5p (tpu_v5): 1 rows (test 1)",
                     "test: 2 files, 2 rows; skipped 1 keys without a result and 0 empty files",
                     f"wrote {out} (2 rows)"]
    written = out.read_bytes()
    args = parse(["published", "--check", "--out", str(out)])
    assert args.func(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"checked {out} (2 rows); nothing written"
    assert out.read_bytes() == written


def test_the_command_reports_bad_input_on_one_line_and_exits_2(tmp_path, monkeypatch, capsys):
    data = tmp_path / "caches"
    write_cache(data / "tpu_v5" / "dot_product_attention.json", {key("bf16[1,x]"): {"{}": result()}})
    monkeypatch.setattr(tc, "read_sources", lambda: [tc.read_source(tc.Source("test", data, "caches"))])
    out = tmp_path / "tokamax.csv"
    args = parse(["published", "--out", str(out)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnbench published: caches/tpu_v5/dot_product_attention.json: entry '")
    assert err.count("\n") == 1 and not out.exists()
    args = parse(["published", "--check", "--out", str(out)])
    assert args.func(args) == 2
    assert "no such file" in capsys.readouterr().err


# ------------------------------------------------------------------------ the names and the vendored data


def test_the_device_names_are_the_projects_profiles_and_targets():
    profiles = tomllib.loads((ROOT / "attnbench/hardware/hardware_profiles.toml").read_text())
    targets = tomllib.loads((ROOT / "attnbench/compiled_for/targets.toml").read_text())["targets"]
    for device in tc.DEVICES.values():
        assert device.hardware_profile == "" or device.hardware_profile in profiles
        assert device.target == "" or device.target in targets
    assert not any("7x" in name or "ironwood" in name.lower() for name in list(profiles) + list(targets))


def test_the_kernels_are_the_projects():
    names = {p.stem.replace("_", "-") for p in (ROOT / "attention_impls").glob("jax_tokamax_*.py")}
    assert {op.kernel for op in tc.OPS.values()} == names


def test_the_vendored_files_are_the_ones_the_readme_lists_unmodified():
    data = tc.VENDORED_DIR
    listed = dict(re.findall(r"^\| `([^`]+\.json\.gz)` \| `[^`]+` \| \d+ \| `([0-9a-f]{64})` \|$",
                             (data / "README.md").read_text(), re.M))
    present = {str(p.relative_to(data)) for p in data.glob("*/*.json.gz")}
    assert set(listed) == present and len(present) >= 10
    for name, digest in listed.items():
        assert hashlib.sha256(gzip.decompress((data / name).read_bytes())).hexdigest() == digest, name
    assert (data / "LICENSE").read_text().lstrip().startswith("Apache License")


def test_the_vendored_caches_read_as_a_table():
    frame = tc.published_rows([tc.vendored_source()])
    assert len(frame) >= 100 and frame["device_kind"].nunique() >= 2
    assert (frame["source"] != "").all() and (frame["source_file"] != "").all()
    assert frame["median_ms"].notna().all() and (frame["median_ms"] > 0).all()
    assert frame["source_url"].str.startswith(tc.REPO_URL).all()
    assert set(frame["kernel"]) <= {op.kernel for op in tc.OPS.values()}
    assert frame["flops"].notna().any()
