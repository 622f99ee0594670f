"""Compiled decode (``--kv-compile``): the decode forward under ``torch.compile`` (:class:`CompiledModel`,
:class:`CountingBackend`, which counts each compiled graph's calls and captures its kernels' bytes for counting
compiles), and what a compiled step did (dynamo's counters: :func:`dynamo_state`). No dispatch mode is active when a
compiled frame is entered. Its use in a session: :mod:`.compiled_session`, :mod:`.compiled_count`; how and why:
docs/compiled.md."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from kvcache.measuring import compat
from kvcache.measuring.compiled.kernel_bytes import KernelBytes, kernel_counts
from kvcache.measuring.counting import traffic

MODES = ("off", "default", "reduce-overhead", "max-autotune")
SETTLE_CONTEXTS = (64, 96)  # untimed contexts a class compiles at before its first timed point (tokens)
SETTLE_STEPS = 2  # untimed compiled steps at each settling context


class CompileProblem(Exception):
    """A class that cannot be compiled here (graph break, recompile limit, backend error); one-line message."""


def unavailable_reason(mode: str, device_type: str) -> str | None:
    """Why ``mode`` cannot run on ``device_type``, or None."""
    if mode == "reduce-overhead" and device_type != "cuda":
        return (f"--kv-compile reduce-overhead is CUDA graphs, which inductor does not use on {device_type} (it "
                "would run the default mode under another name); use --kv-compile default")
    return None


def effective_mode(mode: str, device_type: str) -> str:
    """What inductor runs for ``mode`` on ``device_type`` (CUDA graphs are CUDA only)."""
    if mode == "max-autotune" and device_type != "cuda":
        return "max-autotune-no-cudagraphs"
    return mode


def configure(graphs_needed: int) -> None:
    """Room for every graph the session compiles on the one forward code object, and a loud failure beyond."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), graphs_needed))
    if hasattr(config, "accumulated_recompile_limit"):
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 4 * graphs_needed)
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def mark_static(cache: Any, layers: int) -> int:
    """Mark the K/V tensors of a cache that keeps its buffers (``is_compileable``) as static addresses; how many."""
    if not getattr(cache, "is_compileable", False):
        return 0
    marked = 0
    for layer in range(layers):
        try:
            tensors = compat.layer_kv(cache, layer)
        except (AttributeError, IndexError, KeyError, TypeError):
            break
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel():
                torch._dynamo.mark_static_address(t)
                marked += 1
    return marked


# --- dynamo's counters ---------------------------------------------------------------------------------

def dynamo_state() -> dict[str, int]:
    """Dynamo's counters that move when it compiles: graphs compiled, graph breaks, frames converted."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "frames": int(sum(v for k, v in counters["frames"].items() if k == "ok"))}


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


# --- the timed model -------------------------------------------------------------------------------------

class CountingBackend:
    """Inductor in ``mode`` (``torch.compile``'s own wrapper, the same config patches), with every compiled
    graph's calls counted. ``capture`` (counting compiles only) also keeps each graph's post-grad FX graph and
    inductor's byte count, and runs the graph unfused under a traffic counter when :attr:`counting` is set."""

    def __init__(self, mode: str, *, capture: bool = False) -> None:
        self.mode = mode
        self.inductor = torch._TorchCompileInductorWrapper(None if mode == "default" else mode, None, None)
        self.capture = capture
        self.calls = 0
        self.graphs: list[GraphRecord] = []
        self.counting: traffic.TrafficCounter | None = None
        self.ran: list[int] = []  # indices of the graphs run while counting

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        if not self.capture:
            compiled = self.inductor(gm, example_inputs)

            def run(*args: Any) -> Any:
                self.calls += 1
                return compiled(*args)
            return run
        record = GraphRecord(index=len(self.graphs))
        with _capturing(record), kernel_counts() as counts:
            compiled = self.inductor(gm, example_inputs)
        record.kernels, record.error = counts.get("kernels", []), counts.get("error")
        if record.error is None and "kernels" not in counts:
            record.error = "inductor computed no byte count for this graph (GraphLowering.count_bytes did not run)"
        self.graphs.append(record)

        def run_counted(*args: Any) -> Any:
            self.calls += 1
            if self.counting is None:
                return compiled(*args)
            self.ran.append(record.index)
            record.run_unfused(self.counting, args)
            return compiled(*args)
        return run_counted


@dataclass
class GraphRecord:
    """One graph compiled for counting: its post-grad graph and its kernels' bytes (or why they are missing)."""

    index: int
    post_grad: torch.fx.GraphModule | None = None
    kernels: list[KernelBytes] = field(default_factory=list)
    error: str | None = None

    @property
    def fused_bytes(self) -> int | None:
        """Bytes the graph's kernels read and write (None without a count)."""
        return None if self.error else sum(k.bytes for k in self.kernels)

    @property
    def inductor_bytes(self) -> int | None:
        """Inductor's own count of the same kernels (ordering-only dependencies included), bytes."""
        return None if self.error else sum(k.inductor_bytes for k in self.kernels)

    def run_unfused(self, counter: traffic.TrafficCounter, args: tuple) -> None:
        """The post-grad graph as plain ATen ops under ``counter``, on copies of the step's real inputs (the
        graph mutates the cache; the compiled graph then runs on the originals). The counter is entered inside
        the graph call: dynamo has already dispatched the frame, so it never sees the mode."""
        if self.post_grad is None:
            raise CompileProblem("inductor's post-grad graph was not captured (its custom pass did not run)")
        placeholders = [n for n in self.post_grad.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(args):
            raise CompileProblem(f"the post-grad graph takes {len(placeholders)} inputs, the compiled graph got "
                                 f"{len(args)}: cannot run it unfused")
        inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        with torch.inference_mode(), counter:
            self.post_grad(*inputs)


class CompiledModel:
    """The model with its forward compiled: calls go to ``torch.compile(model.forward, ...)``, everything else
    (config, parameters, submodules) to the model itself. Eager uses of the model never enter dynamo."""

    def __init__(self, model: Any, mode: str, *, capture: bool = False, dynamic: bool | None = None) -> None:
        self.eager = model
        self.backend = CountingBackend(mode, capture=capture)
        self.forward = torch.compile(model.forward, backend=self.backend, fullgraph=True, dynamic=dynamic)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.eager, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)


def compile_problem(exc: BaseException) -> str:
    """One line for a failed compile (graph break, recompile limit, backend error)."""
    kind = type(exc).__name__
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if "graph break" in str(exc).lower() or kind == "Unsupported":
        return f"does not compile with fullgraph=True (graph break): {kind}: {first}"[:400]
    return f"compile failed: {kind}: {first}"[:400]


@contextlib.contextmanager
def compiling_steps() -> Iterator[dict[str, Any]]:
    """Wall time and dynamo's counter movement of the steps run inside (``seconds``, ``moved``)."""
    before, start = dynamo_state(), time.perf_counter()
    out: dict[str, Any] = {}
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - start
        out["moved"] = moved(before, dynamo_state())


# --- the capture of the post-grad graph (counting compiles) -----------------------------------------------

class _CapturePass:
    """``post_grad_custom_post_pass``: a copy of the post-grad graph inductor goes on to lower."""

    def __init__(self, record: GraphRecord) -> None:
        self.record = record

    def __call__(self, graph: torch.fx.Graph) -> None:
        owner = graph.owning_module
        self.record.post_grad = torch.fx.GraphModule(owner, copy.deepcopy(graph))

    def uuid(self) -> None:  # no uuid: inductor's FX-graph and AOT caches are bypassed (a hit would skip the pass)
        return None


def _pass_type() -> type:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return type("KVCapturePass", (_CapturePass, CustomGraphPass), {})


@contextlib.contextmanager
def _capturing(record: GraphRecord) -> Iterator[None]:
    from torch._inductor import config

    with config.patch(post_grad_custom_post_pass=_pass_type()(record)):
        yield
