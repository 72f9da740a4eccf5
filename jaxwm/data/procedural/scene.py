"""Random rooms: a textured box interior with textured spheres and boxes inside.

World frame: y points down (the OpenCV camera basis of an upright camera), the room is
``[-hx, hx] x [-hy, hy] x [-hz, hz]`` with the floor at ``y = +hy``. Cameras move inside
``camera_zone`` (a central box kept clear of objects), so they never enter an object.
"""

import dataclasses
import functools
import threading

import numpy as np

from jaxwm.data.procedural.textures import make_texture

TEXTURE_SIZE = 256


@dataclasses.dataclass(frozen=True, eq=False)
class Scene:
  """A room. Arrays are float32; textures ``[n, T, T, 3]`` in ``[0, 1]``.

  Attributes:
    seed: scene seed.
    half_extent: ``[3]`` room half sizes.
    room_textures: ``[6, T, T, 3]`` for faces ``-x, +x, -y (ceiling), +y (floor), -z, +z``.
    sphere_center, sphere_radius, sphere_textures: ``[S, 3]``, ``[S]``, ``[S, T, T, 3]``.
    box_lo, box_hi, box_textures: ``[B, 3]``, ``[B, 3]``, ``[B, T, T, 3]`` (axis-aligned).
    light_dir: ``[3]`` unit direction towards the light.
    camera_zone: ``[2, 3]`` lower and upper corner of the region cameras stay in.
  """
  seed: int
  half_extent: np.ndarray
  room_textures: np.ndarray
  sphere_center: np.ndarray
  sphere_radius: np.ndarray
  sphere_textures: np.ndarray
  box_lo: np.ndarray
  box_hi: np.ndarray
  box_textures: np.ndarray
  light_dir: np.ndarray
  camera_zone: np.ndarray
  mips: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for name in ("room_textures", "sphere_textures", "box_textures"):
      self.mips[name] = mip_pyramid(getattr(self, name))


def mip_pyramid(textures, min_size=4):
  """Box-filtered mip levels of ``[n, T, T, 3]`` textures: a list, level 0 the original."""
  levels = [textures]
  while levels[-1].shape[1] // 2 >= min_size:
    t = levels[-1]
    levels.append(0.25 * (t[:, 0::2, 0::2] + t[:, 1::2, 0::2] + t[:, 0::2, 1::2] + t[:, 1::2, 1::2]))
  return levels


def _overlaps(lo, hi, others, margin):
  return any(np.all(lo - margin < o_hi) and np.all(o_lo < hi + margin) for o_lo, o_hi in others)


_LOCKS_GUARD = threading.Lock()  # guards _SCENE_LOCKS
_SCENE_LOCKS = {}  # (seed, texture_size) -> the lock its one builder holds (one per room ever asked for)


def make_scene(seed, texture_size=TEXTURE_SIZE):
  """The room of ``seed``, built deterministically; the 16 most recent rooms stay cached.

  Concurrent callers for one room (a loader's reader threads fetching clips of one scene) share a single build
  instead of each building it (``functools.lru_cache`` alone lets every thread build).
  """
  key = (int(seed), int(texture_size))
  with _LOCKS_GUARD:
    lock = _SCENE_LOCKS.setdefault(key, threading.Lock())
  with lock:
    return _cached_scene(*key)


def clear_scene_cache():
  """Forgets the built rooms (benchmarks time a cold build)."""
  _cached_scene.cache_clear()


@functools.lru_cache(maxsize=16)
def _cached_scene(seed, texture_size=TEXTURE_SIZE):
  """Builds the room of ``seed`` (see :func:`make_scene`)."""
  rng = np.random.default_rng(np.random.SeedSequence([0x5CE7E, int(seed)]))
  half = np.array([rng.uniform(3.0, 4.5), rng.uniform(1.3, 1.8), rng.uniform(3.0, 4.5)], np.float32)
  zone_half = np.array([0.3 * half[0], 0.35 * half[1], 0.3 * half[2]], np.float32)
  zone = np.stack([-zone_half, zone_half])
  room_tex = np.stack([make_texture(rng, texture_size) for _ in range(6)])
  taken = [(zone[0], zone[1])]
  spheres, boxes = [], []
  for kind in rng.permutation(["sphere"] * int(rng.integers(1, 4)) + ["box"] * int(rng.integers(1, 4))):
    for _ in range(50):
      if kind == "sphere":
        r = rng.uniform(0.3, 0.75)
        c = rng.uniform(-half + r, half - r).astype(np.float32)
        if rng.random() < 0.6:
          c[1] = half[1] - r  # resting on the floor
        lo, hi = c - r, c + r
      else:
        size = rng.uniform([0.4, 0.4, 0.4], [1.3, 1.6, 1.3]).astype(np.float32)
        c = rng.uniform(-half + size / 2, half - size / 2).astype(np.float32)
        c[1] = half[1] - size[1] / 2
        lo, hi = c - size / 2, c + size / 2
      if not _overlaps(lo, hi, taken, margin=0.3):
        taken.append((lo, hi))
        (spheres if kind == "sphere" else boxes).append((c, r) if kind == "sphere" else (lo, hi))
        break
  tex = lambda n: (np.stack([make_texture(rng, texture_size) for _ in range(n)]) if n else
                   np.zeros((0, texture_size, texture_size, 3), np.float32))
  light = np.array([rng.uniform(-0.5, 0.5), -1.0, rng.uniform(-0.5, 0.5)], np.float32)
  return Scene(
      seed=int(seed),
      half_extent=half,
      room_textures=room_tex,
      sphere_center=np.array([c for c, _ in spheres], np.float32).reshape(-1, 3),
      sphere_radius=np.array([r for _, r in spheres], np.float32),
      sphere_textures=tex(len(spheres)),
      box_lo=np.array([lo for lo, _ in boxes], np.float32).reshape(-1, 3),
      box_hi=np.array([hi for _, hi in boxes], np.float32).reshape(-1, 3),
      box_textures=tex(len(boxes)),
      light_dir=light / np.linalg.norm(light),
      camera_zone=zone,
  )
