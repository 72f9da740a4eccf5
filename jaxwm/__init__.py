"""jaxwm: camera-conditioned streaming video world models in JAX/Flax.

See ``docs/design.md`` for the conventions (OpenCV cameras, ``[B, F, h, w, C]``
latents, ``[B, L, H, Dh]`` attention tensors) used throughout.
"""

__version__ = "0.1.0"
