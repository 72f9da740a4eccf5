"""The camera encodings by name (``model.camera.encoding``): one line each."""

from jaxwm.encodings.base import NoCamera
from jaxwm.encodings.gta import GTA
from jaxwm.encodings.mrope import MRoPE
from jaxwm.encodings.prope import PRoPE
from jaxwm.encodings.viewrope import ViewRope
from jaxwm.encodings.worldrope import WorldRoPE

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


for _enc in (NoCamera(), ViewRope(), GTA(), PRoPE(), MRoPE(), WorldRoPE()):
  register_encoding(_enc)
