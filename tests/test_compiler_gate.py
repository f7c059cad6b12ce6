"""The kernel-build tests skip on a machine without the compilers (saying what to install) and fail
instead when the environment requires them, as .ci/run does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.compiler_gate import REQUIRE_ENV, require_compiler

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def no_compilers_on_path(monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return empty


def test_a_missing_clang_skips_with_the_install_line(no_compilers_on_path, monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV["amd"], raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install clang-22 lld-22"):
        require_compiler("amd")


def test_a_missing_clang_fails_when_required(no_compilers_on_path, monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV["amd"], "1")
    with pytest.raises(pytest.fail.Exception, match=r"ROCMFORGE_REQUIRE_CLANG.*clang-22 not found"):
        require_compiler("amd")


def test_a_missing_nvcc_skips_and_fails_when_required(no_compilers_on_path, monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV["nvidia"], raising=False)
    with pytest.raises(pytest.skip.Exception, match="nvcc"):
        require_compiler("nvidia")
    monkeypatch.setenv(REQUIRE_ENV["nvidia"], "1")
    with pytest.raises(pytest.fail.Exception, match="ROCMFORGE_REQUIRE_NVCC"):
        require_compiler("nvidia")


def _run_build_tests(path_dir: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in REQUIRE_ENV.values()}
    environment.update(PATH=str(path_dir), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(TESTS / "test_kernel_build.py"), str(TESTS / "test_kernel_resources.py")],
                          capture_output=True, text=True, env=environment, cwd=TESTS.parent, timeout=300)


@pytest.mark.slow
def test_the_build_test_files_pass_without_compilers_and_fail_when_clang_is_required(no_compilers_on_path):
    quiet = _run_build_tests(no_compilers_on_path)
    assert quiet.returncode == 0, quiet.stdout[-3000:] + quiet.stderr[-2000:]
    assert "skipped" in quiet.stdout and "apt-get install clang-22 lld-22" in quiet.stdout
    assert " failed" not in quiet.stdout

    required = _run_build_tests(no_compilers_on_path, ROCMFORGE_REQUIRE_CLANG="1")
    assert required.returncode == 1, required.stdout[-3000:]
    assert "failed" in required.stdout and "ROCMFORGE_REQUIRE_CLANG is set" in required.stdout
