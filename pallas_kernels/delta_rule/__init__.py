"""Chunked gated delta rule kernels (KDA / Gated DeltaNet; docs/design.md §7).

Same contract as ``jaxwm.ops.delta_rule.delta_rule_chunked`` plus ``interpret``:
``tpu_delta_rule`` (Mosaic; the grid walks the chunks with the state in VMEM scratch) and
``gpu_delta_rule`` (Triton lowering; one program per (batch, head) loops over the chunks).
Forward and backward kernels share the chunk maths of ``chunk_math``; ``custom_vjp``.
"""

from pallas_kernels.delta_rule.gpu import delta_rule as gpu_delta_rule
from pallas_kernels.delta_rule.tpu import delta_rule as tpu_delta_rule

__all__ = ["gpu_delta_rule", "tpu_delta_rule"]
