"""The release matrix's causes and the upgrade direction (attnbench/releases/api.py, table.py): an API
change is read from the two releases' own surfaces, a packaging fault from a module the framework
does not ship, the adapter from the project's own interpreter names."""

import json
import os

import pytest

import attention_impls
from attnbench.releases import api, matrix, table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "results", "releases", "releases.csv")
FLASH = "jax.experimental.pallas.ops.tpu.flash_attention:flash_attention"
SWITCH = "jax.experimental.pallas.tpu:force_tpu_interpret_mode"


def present(*params, var_keyword=False):
    return {"present": True, "signature": f"({', '.join(params)})", "params": list(params),
            "var_keyword": var_keyword}


def gone(why):
    return {"present": False, "missing": why}


def test_a_name_or_keyword_the_call_uses_that_a_later_release_lacks_is_what_moved():
    calls = {"m:f": ("causal", "block_sizes"), "m:g": ()}
    before = {"m:f": present("q", "causal", "block_sizes"), "m:g": present()}
    assert api.moved(calls, before, before) == []
    lost = api.moved(calls, before, {"m:f": present("q", "causal"), "m:g": present()})
    assert lost == ["m:f no longer takes block_sizes: (q, causal, block_sizes) -> (q, causal)"]
    assert api.moved(calls, before, {"m:f": present("q", var_keyword=True), "m:g": present()}) == []
    removed = api.moved(calls, before, {"m:f": before["m:f"], "m:g": gone("AttributeError: no g")})
    assert removed == ["m:g is gone (AttributeError: no g)"]
    # a module the framework does not ship is packaging, never a moved name
    absl = {"m:f": before["m:f"], "m:g": gone("ModuleNotFoundError: No module named 'absl'")}
    assert api.moved(calls, before, absl) == []
    # a name not there before is nothing an upgrade took away
    assert api.moved(calls, {"m:f": before["m:f"], "m:g": gone("x")}, before) == []


def test_not_shipped_names_a_third_party_module_but_not_the_frameworks_own():
    assert api.not_shipped("ModuleNotFoundError: No module named 'absl.testing'") == "absl.testing"
    assert api.not_shipped("No module named 'jax.experimental.pallas.ops.tpu.splash'") is None
    assert api.not_shipped("AttributeError: no attribute") is None


def test_a_builtin_is_read_from_the_signature_its_docstring_opens_with():
    def documented():
        pass

    documented.__doc__ = ("sdpa(query, key, value, attn_mask=None,\n    is_causal=False, *, scale=None) -> T:"
                          "\n\nText.")
    found = api.documented_signature(documented)
    assert found["params"] == ["query", "key", "value", "attn_mask", "is_causal", "scale"]
    assert not found["var_keyword"]
    assert api.documented_signature(object())["signature"] is None


def test_every_kernel_of_the_matrix_declares_the_public_names_its_call_uses():
    for name in attention_impls.names():
        impl = attention_impls.get(name)
        if impl.framework not in ("jax", "torch"):
            continue
        assert impl.public_calls, name
        for call in api.calls_of(impl):
            module, _, attribute = call.partition(":")
            # a library's kernel (Tokamax's: left out of the matrix) calls its library's names
            owners = (impl.library, *api.FRAMEWORK_MODULES) if impl.library else api.FRAMEWORK_MODULES
            assert module.split(".")[0] in owners and attribute, (name, call)


def _cell(release, status=matrix.OK, surface=None, reason=None, impl="jax-pallas-tpu-flash", env="none",
          **more):
    return {"framework": "jax", "jax": release, "impl": impl, "target": "cpu", "workload": "causal-256",
            "seq_len": 256, "status": status, "reason": reason, "companions": env,
            "seconds_per_step": 0.01 if status == matrix.OK else None,
            "api_surface": json.dumps(surface or {FLASH: present("q", "causal"), SWITCH: present()}), **more}


def test_the_projects_missing_interpreter_switch_is_the_adapter_and_never_a_kernel_break():
    cell = _cell("0.6.2", matrix.API_CHANGED,
                 {FLASH: present("q", "causal"), SWITCH: gone("AttributeError: x")},
                 reason="AttributeError: module has no attribute 'force_tpu_interpret_mode'")
    cause, evidence = table.cause_of({**cell, "release": "0.6.2"})
    assert cause == table.ADAPTER and "force_tpu_interpret_mode" in evidence
    # the same error with the kernel's own call gone too is not the adapter's
    both = {**cell, "api_surface": json.dumps({FLASH: gone("AttributeError: y"),
                                               SWITCH: gone("AttributeError: x")})}
    assert table.cause_of(both)[0] != table.ADAPTER


def test_a_table_without_surfaces_still_tells_the_adapter_from_its_error():
    reason = ("AttributeError: module 'jax.experimental.pallas.tpu' has no attribute "
              "'force_tpu_interpret_mode'")
    old = {**_cell("0.6.2", matrix.API_CHANGED, reason=reason), "api_surface": None, "release": "0.6.2"}
    assert table.cause_of(old)[0] == table.ADAPTER
    other = {**old, "reason": "AttributeError: module 'x' has no attribute 'flash_attention'"}
    assert table.cause_of(other)[0] == table.UNEXPLAINED


def test_a_name_gone_for_two_releases_is_an_api_change_in_both():
    have = {FLASH: present("q", "causal"), SWITCH: present()}
    lost = {FLASH: gone("AttributeError: no flash_attention"), SWITCH: present()}
    rows = [_cell("0.7.2", surface=have)] + [
        _cell(r, matrix.API_CHANGED, surface=lost, reason="AttributeError: no flash_attention")
        for r in ("0.8.2", "0.9.2")]
    causes = [(b["release"], b["cause"]) for b in table.broken(table.matrix_frame(rows))]
    assert causes == [("0.8.2", table.API), ("0.9.2", table.API)]


def test_an_unreadable_signature_loses_no_keyword():
    unreadable = {"m:f": {"present": True, "signature": None, "params": [], "var_keyword": True}}
    assert api.moved({"m:f": ("k",)}, unreadable, {"m:f": present("q")}) == []
    assert api.changed(unreadable, {"m:f": present("q", "k")}) == []


def test_a_packaging_break_says_whether_the_companions_mend_it_and_the_upgrade_view_says_when_it_broke():
    absl = "ModuleNotFoundError: No module named 'absl'"
    rows = [_cell("0.8.2"), _cell("0.9.2", matrix.API_CHANGED, reason=absl), _cell("0.10.2"),
            *(_cell(r, env="absl-py 2.5.1, chex 0.1.90") for r in ("0.8.2", "0.9.2", "0.10.2"))]
    frame = table.matrix_frame(rows)
    [bad] = table.broken(frame)
    assert bad["cause"] == table.PACKAGING and bad["environment"] == "bare"
    assert "beside absl-py 2.5.1, chex 0.1.90 the same cell runs" in bad["evidence"]
    steps = table.upgrade_steps(frame)
    bare = steps[steps["environment"] == "bare"]
    assert bare["outcome"].tolist() == ["broke", "mended"]
    assert (steps[steps["environment"] == "with companions"]["outcome"] == "kept working").all()
    [first] = table.first_breaks(steps)
    assert (first["last_good"], first["first_bad"], first["cause"]) == ("0.8.2", "0.9.2", table.PACKAGING)


def test_a_capability_an_old_release_lacks_is_not_mended_later_but_newly_runs():
    rows = [_cell("0.6.2", matrix.COMPILE_FAILED, reason="NotImplementedError: head_dim_v=64 should be a "
                  "multiple of 128"), _cell("0.7.2")]
    steps = table.upgrade_steps(table.matrix_frame(rows))
    assert steps["outcome"].tolist() == ["newly runs"] and table.first_breaks(steps) == []


def test_a_libtpu_its_jax_does_not_pin_is_its_own_environment_and_a_packaging_cause():
    old = "RuntimeError: Pallas TPU requires a libtpu version that's at most a month old"
    row = {**_cell("0.10.2", matrix.COMPILE_FAILED, reason=old), "target": "tpu-v5e", "libtpu": "0.0.37",
           "seq_len": 4096}
    assert table.environment_of(row) == "libtpu 0.0.37"
    assert table.environment_of({**row, "libtpu": "0.0.42.1"}) == "bare"
    cause, evidence = table.cause_of(row)
    assert cause == table.PACKAGING and "jax 0.10.2 pins libtpu 0.0.42.1" in evidence
    # the libtpu axis runs beside the companions, so that no absl fault hides what libtpu does
    beside = {**row, "companions": "absl-py 2.5.1, chex 0.1.92"}
    pinned = {**beside, "libtpu": "0.0.42.1", "status": matrix.OK, "reason": None}
    grid = table.libtpu_grid(table.matrix_frame([row, beside, pinned]))
    assert list(grid.columns) == ["libtpu 0.0.37", "libtpu 0.0.42.1"]
    assert grid.loc[("tpu-v5e", "jax-pallas-tpu-flash", 4096, "0.10.2 (pins 0.0.42.1)")].tolist() == [
        "compile-failed", "ok"]


@pytest.mark.skipif(not os.path.exists(TABLE), reason="no committed release matrix")
def test_no_name_a_call_passes_moved_so_the_current_call_is_every_releases():
    """Every release runs the current call. That is the call as written for each release only while
    no name or keyword it passes moved between neighbouring releases; a move needs a per-release
    shim (the call as written before it), and this fails until one exists."""
    frame = table.load_table(TABLE)
    assert table.api_moves(frame) == []
    assert not [b for b in table.broken(frame) if b["cause"] == table.API]


def test_api_moves_finds_a_keyword_gone_between_neighbouring_releases():
    rows = [_cell(r, impl="jax-xla", surface={"jax.nn:dot_product_attention": present("q", *keys)})
            for r, keys in (("0.7.2", ("mask", "scale")), ("0.8.2", ("mask",)))]
    frame = table.matrix_frame(rows)
    assert table.api_moves(frame) == [
        "jax-xla 0.7.2 -> 0.8.2: jax.nn:dot_product_attention no longer takes scale: "
        "(q, mask, scale) -> (q, mask)"]
    assert table.api_moves(frame.drop(columns=["api_surface"])) is None


def test_a_parameter_added_is_told_apart_from_one_removed():
    before = {"m:f": present("q", "mask"), "m:g": present("x")}
    after = {"m:f": present("q", "mask", "return_residual"), "m:g": present()}
    assert api.changed(before, after) == ["m:f gained return_residual", "m:g lost x"]
    assert api.moved({"m:f": ("mask",)}, before, after) == []  # nothing the call passes went


def test_a_default_objects_address_is_not_part_of_a_signature():
    sentinel = object()

    def f(x, default=sentinel):
        pass

    f.__module__ = __name__
    globals()["_probe_f"] = f
    assert " at 0x" not in api.entry(f"{__name__}:_probe_f")["signature"]


def test_a_cell_that_ran_and_differs_from_float64_is_a_numerics_break():
    cell = {**_cell("0.9.2", matrix.NUMERICS_FAILED,
                    reason="output differs from the float64 reference: max abs err 0.5"), "release": "0.9.2"}
    cause, evidence = table.cause_of(cell)
    assert cause == table.NUMERICS and "max abs err 0.5" in evidence
