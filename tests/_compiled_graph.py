"""What torch.compile traces: the code of the graphs dynamo hands its backend, for tests that check which ops a
compiled model calls."""
from __future__ import annotations

import torch


def graph_code(model, x) -> tuple:
    """(the generated code of every graph of ``torch.compile(model, fullgraph=True)`` traced without grad on x,
    the traced model's output); dynamo's caches are reset first."""
    code = []

    def backend(gm, inputs):
        code.append(gm.code)
        return gm.forward
    torch._dynamo.reset()
    with torch.no_grad():
        y = torch.compile(model, backend=backend, fullgraph=True)(x)
    return "\n".join(code), y
