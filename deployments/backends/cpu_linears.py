"""A float32 model's linear layers on oneDNN's matmul when it runs on the CPU.

torch runs `nn.Linear` on the CPU through MKL's sgemm. At the few rows a decoding step has, that is slow
for wide layers: on this project's 2-core AMD EPYC box (torch 2.13, MKL 2024.2, one thread) the Marian-
sized output projection (512 -> 58,101) took 7.3 ms for 1 row, 14.4 for 2 and 21.7 for 3 (a
matrix-vector pass per row), 12.8 for 8 and 25.5 for 32. oneDNN's matmul on the same dense weight
(`torch.ops.mkldnn._linear_pointwise`, what torch.compile's CPU backend calls) took 5.3, 7.9, 7.7, 9.0
and 15.1 ms. A decoding step of the whole model went from 16.4 / 36.2 / 63.9 ms at 1 / 3 / 32 rows to
12.0 / 18.2 / 42.6 ms (docs/benchmarks/continuous-batching.md, "oneDNN").

The embeddings' torch engine uses it too: MiniLM's texts/s at batches of 8-64 on one thread went from
95-97 to 173 (docs/benchmarks/onnx.md).

Each weight is then reordered once into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`,
what torch.compile's CPU backend does with frozen weights). Given the plain layout, oneDNN reorders it on
every call, and at a few rows that costs as much as the product. A Marian-sized continuous decoding step on
one thread, plain layout -> blocked, in ms: 20.8 -> 18.2 at 1 row, 31.8 -> 16.0 at 4, 36.4 -> 21.4 at 8, 68.9
-> 51.5 at 32; on the length mix continuous decoding's saturation rose 1.19 x and its p50 at half of it fell
from 1.84 to 1.26 x the solo decode (docs/benchmarks/continuous-batching.md, "Seventh sitting").

The blocked copy is anonymous memory, while the plain weights are the model file's mapped pages:
+282 MiB for the Marian-sized model, +42 MiB for MiniLM. The plain parameter is dropped where nothing else
holds it; a tied output projection keeps it, because the embeddings read it. `dense_weight(layer)` gives the
plain weight back to code that reads it. `cpu_weight_layout: plain` (translation and embeddings settings) keeps
the plain weights for memory-bound deployments: oneDNN's matmul on the plain layout, no copy.

`linears_on_onednn(model, layout)` turns each `nn.Linear` of a float32 CPU model into a `OneDnnLinear` (the same
module, parameters and tied weights, with that forward) once oneDNN has answered a probe layer as
`nn.Linear` does; where torch lacks the op or the probe disagrees, the model is left as it was.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

logger = logging.getLogger(__name__)

#: a probe layer's outputs must agree with `F.linear`'s to this (float32 rounding, other summation order)
PROBE_TOLERANCE = dict(rtol=1e-4, atol=1e-5)
#: the layouts `linears_on_onednn` can leave the weights in (the settings' `cpu_weight_layout`)
WEIGHT_LAYOUTS = ("blocked", "plain")
#: the rows oneDNN is told to expect when it picks a weight's blocked layout. Any hint from 2 up to 64 gave the
#: same layout's speed at 1-64 rows on this machine; a hint of 1 keeps the plain layout's speed.
PACKED_FOR_ROWS = 64


class OneDnnLinear(nn.Linear):
    """`nn.Linear` computed by oneDNN's matmul (inference only: the op has no autograd formula), on its weight in
    oneDNN's blocked layout once `pack` has run, else on the plain weight."""

    #: oneDNN's blocked copy of the weight (`pack`); None until then
    packed_weight: Optional[torch.Tensor] = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.packed_weight is None else self.packed_weight
        return torch.ops.mkldnn._linear_pointwise(x, weight, self.bias, "none", [], "")

    def pack(self, keep_plain: bool) -> bool:
        """Reorder the weight into the blocked layout; without `keep_plain` the plain weight is dropped (the
        parameter becomes None: `dense_weight` rebuilds it). False where this torch cannot reorder."""
        if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
            return False
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACKED_FOR_ROWS)
        if not keep_plain:
            self.register_parameter("weight", None)
        return True


def dense_weight(layer: nn.Linear) -> torch.Tensor:
    """`layer`'s weight in the plain (out_features, in_features) layout, also after `pack` dropped it."""
    if layer.weight is not None:
        return layer.weight
    return layer.packed_weight.to_dense()


def onednn_agrees() -> bool:
    """True if this torch has oneDNN's linear op and it answers a probe layer as `nn.Linear` does."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    generator = torch.Generator().manual_seed(0)
    probe = nn.Linear(48, 80)
    with torch.no_grad():
        probe.weight.copy_(torch.randn(80, 48, generator=generator))
        probe.bias.copy_(torch.randn(80, generator=generator))
        x = torch.randn(3, 1, 48, generator=generator)
        expected = F.linear(x, probe.weight, probe.bias)
        probe.__class__ = OneDnnLinear
        try:
            got = [probe(x)]
            if probe.pack(keep_plain=True):
                got.append(probe(x))
        except (RuntimeError, NotImplementedError) as exc:
            logger.info("oneDNN's linear is not usable here (%s); linear layers stay on torch's default", exc)
            return False
        agrees = all(g.shape == (3, 1, 80) and torch.allclose(g, expected, **PROBE_TOLERANCE) for g in got)
    if not agrees:
        logger.warning("oneDNN's linear disagrees with torch's on a probe layer; linear layers stay on torch's")
    return agrees


def linears_on_onednn(model: nn.Module, layout: str = "blocked") -> int:
    """Turn `model`'s float32 CPU `nn.Linear` layers into `OneDnnLinear`, on blocked weights for `layout`
    "blocked" (a weight that another module also holds, such as an output projection tied to the embeddings,
    keeps its plain copy too) or on the plain ones for "plain"; returns how many were turned."""
    if layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"cpu_weight_layout must be one of {WEIGHT_LAYOUTS}, got {layout!r}")
    linears = [m for m in model.modules() if type(m) is nn.Linear
               and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]
    if not linears or not onednn_agrees():
        return 0
    holders = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    for layer in linears:
        layer.__class__ = OneDnnLinear  # same object: its parameters, ties and hooks are kept
        if layout == "blocked":
            layer.pack(keep_plain=holders[id(layer.weight)] > 1)
    return len(linears)


def weight_layout(model: object) -> Optional[str]:
    """The layout `model`'s linear layers run on: "blocked" or "plain" (oneDNN), None where none is on oneDNN
    (or `model` is no torch module)."""
    modules = model.modules() if isinstance(model, nn.Module) else ()
    layer = next((m for m in modules if isinstance(m, OneDnnLinear)), None)
    if layer is None:
        return None
    return "plain" if layer.packed_weight is None else "blocked"


__all__ = ["WEIGHT_LAYOUTS", "OneDnnLinear", "dense_weight", "weight_layout", "linears_on_onednn", "onednn_agrees"]
