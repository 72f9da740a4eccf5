"""Bounded-memory streaming (docs/design.md §8): which earlier frames each new chunk attends to.

``full`` (everything), ``window`` (sink + sliding window), ``landmark`` (ReWorld's pose-indexed
landmark bank) and ``panorama`` (LOCI's coverage bank). ``make_policy(name, ...)`` builds one.
"""

from jaxwm.memory.landmark import LandmarkMemory
from jaxwm.memory.panorama import PanoramaMemory
from jaxwm.memory.policy import FullMemory, MemoryPolicy, WindowMemory

POLICIES = ("full", "window", "landmark", "panorama")


def make_policy(name, *, max_frames, chunk_frames, image_hw, **kwargs):
  """A policy by name; ``max_frames`` bounds ``full``, ``chunk_frames`` sizes ``landmark``'s slots,
  ``image_hw`` (pixels) gives ``panorama``'s field-of-view masks; ``kwargs`` go to the policy."""
  if name == "full":
    return FullMemory(max_frames, **kwargs)
  if name == "window":
    return WindowMemory(**kwargs)
  if name == "landmark":
    return LandmarkMemory(chunk_frames, **kwargs)
  if name == "panorama":
    return PanoramaMemory(image_hw, **kwargs)
  raise ValueError(f"memory policy must be one of {POLICIES}; got {name!r}")


__all__ = ["FullMemory", "LandmarkMemory", "MemoryPolicy", "PanoramaMemory", "WindowMemory", "POLICIES",
           "make_policy"]
