"""Channel placements of the camera encodings within a head (ViewRope Table 5, docs/design.md §4).

A placement is a list of ``[start, end)`` ranges of head channels. Named placements, for a
head of ``D`` channels split ``[t | h | w]`` by the backbone RoPE:

- ``t_low``: the 12 lowest-frequency temporal channels ``[t - 12, t)`` (``[32, 44)`` at D = 128);
- ``hw_low`` / ``hw_low_replace``: the 12 lowest-frequency channels of ``h`` and of ``w``
  (``[74, 86) + [116, 128)`` at D = 128); ``_replace`` switches the RoPE of those channels off;
- ``all``: every channel (rounded down to the encoding's unit);
- ``hw``: every h and w channel ``[t, D)`` (WorldRoPE's placement: time RoPE stays on ``t``).
"""

from jaxwm.encodings.rope3d import rope_axis_dims

PLACEMENTS = ("t_low", "hw_low", "hw_low_replace", "all", "hw")


def resolve_channels(channels, head_dim, encoding, unit):
  """Placement name or explicit ranges -> ``(ranges, replace_rope)``, validated; ``unit`` is the
  encoding's channels per transform (every range is a multiple of it).

  Raises:
    ValueError: naming the encoding, the ranges and the reason when they do not fit.
  """
  t, h, _ = rope_axis_dims(head_dim)
  replace = False
  if isinstance(channels, str):
    if channels not in PLACEMENTS:
      raise ValueError(f"model.camera.channels={channels!r} is not a placement {PLACEMENTS} or a list of ranges")
    replace = channels.endswith("_replace")
    if channels == "t_low":
      if t < 12:
        raise ValueError(f"model.camera.channels='t_low' needs 12 temporal RoPE channels; head dim {head_dim} has {t}")
      ranges = [(t - 12, t)]
    elif channels.startswith("hw_low"):
      if h < 12:
        raise ValueError(f"model.camera.channels={channels!r} needs 12 channels in each of the h and w RoPE blocks; "
                         f"head dim {head_dim} has {h}")
      ranges = [(t + h - 12, t + h), (head_dim - 12, head_dim)]
    elif channels == "hw":
      ranges = [(t, head_dim)]
    else:
      ranges = [(0, head_dim - head_dim % unit)]
  else:
    ranges = [tuple(int(x) for x in r) for r in channels]
  for s, e in ranges:
    if not 0 <= s < e <= head_dim:
      raise ValueError(f"model.camera.channels range [{s}, {e}) is outside the head's {head_dim} channels "
                       f"(encoding {encoding!r})")
    if (e - s) % unit:
      raise ValueError(f"model.camera.channels range [{s}, {e}) has {e - s} channels, not a multiple of {unit} "
                       f"as {encoding!r} needs ({'3D rotations' if unit == 3 else f'{unit}-channel tiles'})")
  flat = sorted(c for s, e in ranges for c in range(s, e))
  if len(flat) != len(set(flat)):
    raise ValueError(f"model.camera.channels ranges {ranges} overlap")
  if not flat:
    raise ValueError("model.camera.channels selects no channel")
  return tuple(ranges), replace


def channel_index(ranges):
  """Flat channel indices of ``ranges`` (static)."""
  return [c for s, e in ranges for c in range(s, e)]
