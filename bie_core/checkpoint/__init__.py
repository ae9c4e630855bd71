"""Weight-only checkpoints: GPTQ (AutoGPTQ / GPTQModel / Hugging Face layout)
and GreenBit (GBA) files in, canonical bie layers out, and back."""
from .gba_layout import decode_gba_statistics, encode_gba_statistics
from .io import CheckpointError
from .loader import LoadReport, gptq_state_dict, load_quantized, quantize_model, save_quantized

__all__ = ["load_quantized", "save_quantized", "quantize_model", "gptq_state_dict", "LoadReport",
           "CheckpointError", "decode_gba_statistics", "encode_gba_statistics"]
