"""kernels build's progress: a long compile is never silent (everyday tier: no compiler runs, the compile is faked)."""

from __future__ import annotations

from rocmforge_kernels import build as kbuild


def test_a_long_compile_is_never_silent(tmp_path, monkeypatch):
    """With nothing finished for HEARTBEAT_SECONDS, a line names the compiles still running and their time."""
    import time

    def slow_compile(vendor, compiler, version, target, op, sources, out_dir, writer):
        time.sleep(0.5 if op == "add" else 0.0)
        return kbuild.ObjectResult(target=target, op=op, ok=False, error="not compiled here", seconds=0.5)

    monkeypatch.setattr(kbuild, "_compile_one", slow_compile)
    monkeypatch.setattr(kbuild, "find_compiler_problem", lambda vendor, compiler: None)
    monkeypatch.setattr(kbuild, "compiler_version", lambda compiler: "test")
    monkeypatch.setattr(kbuild, "HEARTBEAT_SECONDS", 0.1)
    lines: list[str] = []
    report = kbuild.build(out_dir=tmp_path, amd_targets="gfx1100", nvidia_targets="none", ops=["add", "rmsnorm"],
                          jobs=2, progress=lines.append)
    assert len(report.results) == 2
    still = [line for line in lines if line.startswith("still compiling")]
    assert still and "gfx1100 add" in still[0] and "(1/2 done)" in still[-1], lines
    assert lines[-1].startswith("[2/2] gfx1100 add: FAILED")
