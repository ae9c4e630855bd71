"""The Python snippets of docs/integrations.md run as written, in order, in
one namespace (as the page says), from a temporary working directory."""
import os
import re
import warnings

import pytest

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "integrations.md")


def snippets() -> list:
    with open(DOC) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_the_page_has_a_snippet_per_integration():
    text = "\n".join(snippets())
    assert len(snippets()) == 3
    for needle in ("quantization_config=BieConfig(", "peft.get_peft_model(", "bie_core.compat.bitorch_engine"):
        assert needle in text


def test_snippets_run_as_written(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers", reason="optional extra: pip install transformers")
    pytest.importorskip("peft", reason="optional extra: pip install peft")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace = {"__name__": "__docs__"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")      # fallback notices of the CPU-only machine
        for i, code in enumerate(snippets()):
            exec(compile(code, f"{DOC}:snippet{i + 1}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "MPQLinear(in_features=64, out_features=128, bits=4, group_size=32" in out
    assert "trainable params" in out and "Linear" in out
