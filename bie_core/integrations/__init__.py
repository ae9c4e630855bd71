"""Bridges to the libraries users already work with. Each submodule imports
its library on first import and is never imported by ``bie_core`` itself:

* ``bie_core.integrations.transformers``: the ``"bie"`` quantization method of
  Hugging Face transformers (``from_pretrained(..., quantization_config=BieConfig())``);
* ``bie_core.integrations.peft``: LoRA adapters on bie layers through PEFT.

See ``docs/integrations.md``.
"""
