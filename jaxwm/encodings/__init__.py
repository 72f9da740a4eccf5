"""Camera encodings: transforms of q, k (and for some v and the output) on a channel range.

``rope3d`` (the Wan baseline) lives here; the camera encodings of the papers plug into the
same place of the attention (DESIGN §4).
"""

from jaxwm.encodings.rope3d import apply_rotary, rope3d_angles, rope_axis_dims, rope_frequencies

ENCODINGS = ("rope3d",)
