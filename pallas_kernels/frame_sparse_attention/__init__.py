"""Frame-sparse attention kernels (ViewRope Eq. 12; docs/design.md §6).

Same contract as ``jaxwm.ops.frame_sparse.gathered_attention`` plus ``block_q``, ``block_k``
and ``interpret``: ``tpu_attention`` (Mosaic, ``PrefetchScalarGridSpec``) and
``gpu_attention`` (Triton lowering, frame lists as an input). Both have a ``custom_vjp``.
"""

from pallas_kernels.frame_sparse_attention.gpu import attention as gpu_attention
from pallas_kernels.frame_sparse_attention.tpu import attention as tpu_attention

__all__ = ["gpu_attention", "tpu_attention"]
