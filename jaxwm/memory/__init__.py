"""Bounded-memory streaming (docs/design.md §8): which earlier frames each new chunk attends to.

``full`` (everything), ``window`` (sink + sliding window), ``landmark`` (ReWorld's pose-indexed
landmark bank) and ``panorama`` (LOCI's coverage bank). ``make_policy(name, ...)`` builds one.

The policies by name: each module of :data:`MODULES` lists its :class:`MemoryPolicy` subclasses in ``POLICIES``
(one line here per module); :func:`register_policy` adds one at run time.
"""

import importlib

from jaxwm.memory.landmark import LandmarkMemory
from jaxwm.memory.panorama import PanoramaMemory
from jaxwm.memory.policy import FullMemory, MemoryPolicy, WindowMemory

MODULES = (
    "policy",  # full, window
    "landmark",
    "panorama",
)

POLICIES = {}  # name -> MemoryPolicy subclass


def register_policy(cls):
  """Adds a :class:`MemoryPolicy` subclass under its ``name``; returns it."""
  if not (isinstance(cls, type) and issubclass(cls, MemoryPolicy)) or cls.name in ("", "base"):
    raise ValueError(f"a memory policy must be a named MemoryPolicy subclass; got {cls!r}")
  if POLICIES.get(cls.name, cls) is not cls:
    raise ValueError(f"memory policy {cls.name!r} is already registered ({POLICIES[cls.name]})")
  POLICIES[cls.name] = cls
  return cls


def make_policy(name, *, max_frames, chunk_frames, image_hw, **kwargs):
  """A policy by name (:meth:`MemoryPolicy.build`): ``max_frames`` bounds ``full``, ``chunk_frames`` sizes
  ``landmark``'s slots, ``image_hw`` (pixels) gives ``panorama``'s field-of-view masks; ``kwargs`` go to the
  policy."""
  if name not in POLICIES:
    raise ValueError(f"memory policy must be one of {tuple(POLICIES)}; got {name!r}")
  return POLICIES[name].build(max_frames=max_frames, chunk_frames=chunk_frames, image_hw=image_hw, **kwargs)


for _module in MODULES:
  for _cls in importlib.import_module(f"jaxwm.memory.{_module}").POLICIES:
    register_policy(_cls)

__all__ = ["FullMemory", "LandmarkMemory", "MemoryPolicy", "PanoramaMemory", "WindowMemory", "POLICIES",
           "make_policy", "register_policy"]
