"""CUDA-graph helpers shared by the GPU tests."""
from __future__ import annotations

import torch


def graph_replays(call, static_x, fresh, check, replays):
    """Capture call(static_x) in a CUDA graph (after a warm-up on a side stream: no host sync inside, counters
    reset) and check the graph's output after each replay with new contents of static_x."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(static_x)
    for _ in range(replays):
        static_x.copy_(fresh())
        graph.replay()
        torch.cuda.synchronize()
        check(out)   # (checked before the next replay overwrites it)
