"""The camera encodings by name (``model.camera.encoding``): one line each in :data:`MODULES`.

Each module of ``jaxwm.encodings`` listed here defines ``ENCODING``, an instance of a
:class:`jaxwm.encodings.base.CameraEncoding` subclass; :func:`register_encoding` adds one at run time.
"""

import importlib

MODULES = (
    "base",  # rope3d: no camera
    "viewrope",
    "gta",
    "prope",
    "mrope",
    "worldrope",
)

ENCODINGS = {}


def register_encoding(encoding):
  """Adds a :class:`jaxwm.encodings.base.CameraEncoding` instance under its ``name``; returns it."""
  if encoding.name in ENCODINGS and type(ENCODINGS[encoding.name]) is not type(encoding):
    raise ValueError(f"camera encoding {encoding.name!r} is already registered ({type(ENCODINGS[encoding.name])})")
  ENCODINGS[encoding.name] = encoding
  return encoding


def get_encoding(name):
  """The registered encoding called ``name``; ``ValueError`` listing the valid names otherwise."""
  if name not in ENCODINGS:
    raise ValueError(f"model.camera.encoding must be one of {tuple(ENCODINGS)}; got {name!r}")
  return ENCODINGS[name]


for _module in MODULES:
  register_encoding(importlib.import_module(f"jaxwm.encodings.{_module}").ENCODING)
