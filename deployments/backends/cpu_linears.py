"""A float32 model's linear layers on oneDNN's matmul when it runs on the CPU.

torch runs `nn.Linear` on the CPU through MKL's sgemm. At the few rows a decoding step has, that is slow
for wide layers: on this project's 2-core AMD EPYC box (torch 2.13, MKL 2024.2, one thread) the Marian-
sized output projection (512 -> 58,101) took 7.3 ms for 1 row, 14.4 for 2 and 21.7 for 3 (a
matrix-vector pass per row), 12.8 for 8 and 25.5 for 32. oneDNN's matmul on the same dense weight
(`torch.ops.mkldnn._linear_pointwise`, what torch.compile's CPU backend calls; no copy of the weight)
took 5.3, 7.9, 7.7, 9.0 and 15.1 ms. A decoding step of the whole model went from 16.4 / 36.2 / 63.9 ms
at 1 / 3 / 32 rows to 12.0 / 18.2 / 42.6 ms (docs/benchmarks/continuous-batching.md, "oneDNN").

The embeddings' torch engine uses it too: MiniLM's texts/s at batches of 8-64 on one thread went from
95-97 to 173 (docs/benchmarks/onnx.md).

`linears_on_onednn(model)` turns each `nn.Linear` of a float32 CPU model into a `OneDnnLinear` (the same
module, parameters and tied weights, with that forward) once oneDNN has answered a probe layer as
`nn.Linear` does; where torch lacks the op or the probe disagrees, the model is left as it was.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.nn import functional as F

logger = logging.getLogger(__name__)

#: a probe layer's outputs must agree with `F.linear`'s to this (float32 rounding, other summation order)
PROBE_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


class OneDnnLinear(nn.Linear):
    """`nn.Linear` computed by oneDNN's matmul (inference only: the op has no autograd formula)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


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
        try:
            got = OneDnnLinear.forward(probe, x)
        except (RuntimeError, NotImplementedError) as exc:
            logger.info("oneDNN's linear is not usable here (%s); linear layers stay on torch's default", exc)
            return False
        agrees = got.shape == (3, 1, 80) and torch.allclose(got, F.linear(x, probe.weight, probe.bias),
                                                            **PROBE_TOLERANCE)
    if not agrees:
        logger.warning("oneDNN's linear disagrees with torch's on a probe layer; linear layers stay on torch's")
    return agrees


def linears_on_onednn(model: nn.Module) -> int:
    """Turn `model`'s float32 CPU `nn.Linear` layers into `OneDnnLinear`; returns how many were turned."""
    linears = [m for m in model.modules() if type(m) is nn.Linear
               and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]
    if not linears or not onednn_agrees():
        return 0
    for layer in linears:
        layer.__class__ = OneDnnLinear  # same object: its parameters, ties and hooks are kept
    return len(linears)


__all__ = ["OneDnnLinear", "linears_on_onednn", "onednn_agrees"]
