"""QLoRA-style fine-tuning with bie: a causal LM loaded through transformers
with its linears quantized to 4-bit bie layers (``BieConfig``), LoRA adapters
from PEFT on top, trained on a small synthetic task.

By default the model is a tiny Llama built from a config (random weights, no
download; a minute on a CPU). ``--model PATH`` takes a local checkpoint
instead: a float one is quantized on load, a GPTQ / GreenBit one loads as it is.

    python examples/qlora_finetune.py                      # CPU, tiny model
    python examples/qlora_finetune.py --device cuda        # GPU
    python examples/qlora_finetune.py --model /path/to/llama --bits 4 --group-size 128 --device cuda

The task: continue arithmetic sequences (``a, a+d, a+2d, ...`` modulo the
vocabulary size); the loss falls from about ln(vocab) as the adapters learn it.
Prints the loss before and after, the trainable-parameter count, and checks that
the saved adapter reloads onto a freshly loaded quantized model with the same
result.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def sequences(n: int, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, vocab, (n, 1), generator=generator)
    step = torch.randint(1, 5, (n, 1), generator=generator)
    return (start + step * torch.arange(length)) % vocab


def tiny_llama(path: str, seed: int) -> None:
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="local checkpoint folder (default: a tiny random Llama)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import peft
    import transformers

    import bie_core.integrations.peft  # noqa: F401  (registers bie layers with PEFT)
    from bie_core import MPQLinear
    from bie_core.integrations.transformers import BieConfig

    work = tempfile.mkdtemp(prefix="bie_qlora_")
    path = args.model
    if path is None:
        path = os.path.join(work, "tiny_llama")
        tiny_llama(path, args.seed)

    def load():
        qc = BieConfig(bits=args.bits, group_size=args.group_size)
        return transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=qc,
                                                                 device_map=args.device)

    model = load()
    n_q = sum(isinstance(m, MPQLinear) for m in model.modules())
    print(f"model: {n_q} linear layers are bie MPQLinear ({args.bits}-bit, group size {args.group_size}) "
          f"on {args.device}")
    lcfg = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"], task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lcfg)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"trainable parameters (LoRA): {trainable}")

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    held_out = sequences(32, args.seq, vocab, g).to(args.device)

    def eval_loss(m) -> float:
        m.eval()
        with torch.no_grad():
            return m(input_ids=held_out, labels=held_out).loss.item()

    before = eval_loss(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    t0 = time.perf_counter()
    model.train()
    for step in range(args.steps):
        batch = sequences(args.batch, args.seq, vocab, g).to(args.device)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}")
    secs = time.perf_counter() - t0
    after = eval_loss(model)
    print(f"held-out loss: {before:.3f} -> {after:.3f} ({args.steps} steps, {secs:.1f} s)")

    adapter = os.path.join(work, "adapter")
    model.save_pretrained(adapter)
    reloaded = peft.PeftModel.from_pretrained(load(), adapter)
    again = eval_loss(reloaded)
    print(f"adapter reloaded onto a fresh quantized model: held-out loss {again:.3f}")
    if abs(again - after) > 1e-3 * max(1.0, abs(after)):
        raise SystemExit("the reloaded adapter gives another loss")
    if not after < before:
        raise SystemExit("the loss did not fall")


if __name__ == "__main__":
    main()
