"""Cold compiler caches: each case compiles against an empty Inductor cache and no jax cache."""

from __future__ import annotations

import os

import pytest

from attnbench.measure.compiler_caches import INDUCTOR_DIR, compiler_caches
from attnbench.measure.engine import Options
from tests.conftest import FRAMEWORKS


def test_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="compile_cache must be one of cold, warm, got 'lukewarm'"):
        Options(compile_cache="lukewarm")
    with pytest.raises(ValueError, match="compile_cache"), compiler_caches("hot"):
        pass


def test_cold_gives_an_empty_directory_and_restores_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(INDUCTOR_DIR, str(tmp_path))
    with compiler_caches("cold"):
        inside = os.environ[INDUCTOR_DIR]
        assert inside != str(tmp_path) and os.listdir(inside) == []
        assert os.environ["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    assert os.environ[INDUCTOR_DIR] == str(tmp_path)
    assert not os.path.exists(inside)  # removed with the case
    assert "JAX_ENABLE_COMPILATION_CACHE" not in os.environ


def test_warm_leaves_everything_as_it_was(monkeypatch, tmp_path):
    monkeypatch.setenv(INDUCTOR_DIR, str(tmp_path))
    with compiler_caches("warm"):
        assert os.environ[INDUCTOR_DIR] == str(tmp_path)


@pytest.mark.skipif("jax" not in FRAMEWORKS, reason="jax runs in the main venv")
def test_cold_switches_off_jax_persistent_cache_and_restores_it():
    import jax

    assert jax.config.jax_enable_compilation_cache
    with compiler_caches("cold"):
        assert not jax.config.jax_enable_compilation_cache
    assert jax.config.jax_enable_compilation_cache


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="torch runs in the main venv")
@pytest.mark.slow
def test_inductor_compiles_into_the_cold_directory():
    """The directory is really the one Inductor writes to, so nothing compiled before can be reused."""
    import torch

    def double_plus_one(x):
        return x * 2 + 1

    with compiler_caches("cold"):
        directory = os.environ[INDUCTOR_DIR]
        compiled = torch.compile(double_plus_one, dynamic=False)
        assert torch.equal(compiled(torch.arange(4.0)), torch.arange(4.0) * 2 + 1)
        written = [name for _, _, files in os.walk(directory) for name in files]
        assert written, "Inductor wrote nothing into the cold cache directory"
