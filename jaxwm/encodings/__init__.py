"""Camera encodings: transforms of head-channel ranges of q, k, v and the attention output.

One file per encoding (``viewrope``, ``gta``, ``prope``, ``mrope``, ``worldrope``; ``rope3d`` is
the backbone RoPE alone), each a :class:`jaxwm.encodings.base.CameraEncoding`, listed in
``jaxwm.encodings.registry``. docs/design.md §4 has the maths.
"""

from jaxwm.encodings.registry import ENCODINGS, get_encoding, register_encoding
from jaxwm.encodings.rope3d import apply_rotary, rope3d_angles, rope_axis_dims, rope_frequencies
