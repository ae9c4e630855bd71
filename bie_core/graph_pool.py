"""Tensors that outlive a call, kept out of CUDA-graph memory pools.

``torch.compile(mode="reduce-overhead")`` (CUDA graph trees) runs a graph's first calls eagerly, a warm-up, with
every CUDA allocation of the calling thread routed to the graph's private memory pool. After each such call it checks
that only the graph's outputs stay alive in that pool. A prepared weight layout or a kernel's semaphore buffer built
during the warm-up is kept for later calls: in the pool it fails that check ("tensor(s) in the cudagraph pool not
tracked as outputs"), and a later replay could overwrite it.

:func:`outside_graph_pool` builds such state in a short-lived helper thread when the calling thread is in a warm-up.
The pool routing is per thread, so the helper's allocations come from the ordinary allocator. Its kernels go to the
caller's current stream, in order with the caller's work. Outside a warm-up it calls ``build`` directly.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


def in_graph_pool_warmup(device=None) -> bool:
    """Whether this thread's CUDA allocations on ``device`` (None: the current CUDA device) go to a CUDA graph
    tree's pool for a warm-up run.

    A warm-up runs on the tree manager's own stream without capturing. The check reads torch's graph-tree state
    (not a public API): where that state is not as expected it answers False, and the build happens in place."""
    trees = sys.modules.get("torch._inductor.cudagraph_trees")
    if trees is None:   # torch.compile's CUDA graphs were never used in this process
        return False
    if device is None:   # the current CUDA device
        if not torch.cuda.is_initialized():
            return False
        device = torch.device("cuda")
    if not isinstance(device, torch.device) or device.type != "cuda":
        return False
    try:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        mgr = trees.get_manager(idx, create_if_none_exists=False)
        if mgr is None:
            return False
        stream = torch.cuda.current_stream(idx)
        return stream == getattr(mgr, "stream", None) and not torch.cuda.is_current_stream_capturing()
    except Exception:  # noqa: BLE001 - torch internals changed: build in place
        return False


def outside_graph_pool(build: Callable[[], T], device=None) -> T:
    """``build()``, with the tensors it allocates on ``device`` (None: the current CUDA device) kept out of a CUDA
    graph tree's warm-up pool.

    Use it for state kept past the call that builds it: prepared layouts, memoised derived weights, persistent
    scratch buffers. In a warm-up, a helper thread runs ``build`` on the caller's device and stream (see
    :func:`in_helper_thread`)."""
    if not in_graph_pool_warmup(device):
        return build()
    idx = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(idx)
    return in_helper_thread(build, lambda: _cuda_place(idx, stream))


@contextlib.contextmanager
def _cuda_place(idx: int, stream):
    with torch.cuda.device(idx), torch.cuda.stream(stream):
        yield


def in_helper_thread(build: Callable[[], T], place: Callable[[], contextlib.AbstractContextManager]) -> T:
    """``build()`` run to completion in a new thread, inside ``place()``, with the caller's context variables
    (the dispatcher's backend choice, ``explain``'s recorder), grad mode and inference mode; its exception, if
    any, is raised in the caller."""
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    ctx = contextvars.copy_context()
    out: list = []

    def work():
        try:
            with place(), torch.inference_mode(inference), torch.set_grad_enabled(grad):
                out.append((True, ctx.run(build)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out.append((False, exc))

    t = threading.Thread(target=work, name="bie-outside-graph-pool", daemon=True)
    t.start()
    t.join()
    ok, val = out[0]
    if not ok:
        raise val
    return val
