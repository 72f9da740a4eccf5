"""The model side of the viewer: one :class:`Player` per person, a walk driven by keys and drags.

A player holds an interactive :class:`jaxwm.sampling.streaming.Session` under a memory policy, the camera pose
(OpenCV, re-anchored on the first frame) and the path so far. :meth:`Player.step` turns the keys held and the
drag since the last chunk into the next chunk's poses (:mod:`jaxwm.sampling.controls`), generates the chunk and
returns its frames as uint8 images; :meth:`Player.step` with ``back=True`` flies the camera back to frame 0's
pose over the next chunks (the loop-closure moment). Deterministic: the same first frame, seed, key and drag
sequence give the same frames.
"""

import dataclasses
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxwm.memory import POLICIES, make_policy
from jaxwm.models import vae
from jaxwm.sampling.clips import eval_clip, make_sampler
from jaxwm.sampling.controls import Controls, return_path

MAX_STEPS = 50


@dataclasses.dataclass
class Model:
  """A restored checkpoint (:func:`jaxwm.sampling.load.load_model`) and what the viewer needs of it."""
  config: object
  model: object
  variables: object
  step: int
  max_frames: int = 65  # the full memory's capacity (a walk under it ends there)

  @property
  def image_size(self):
    return int(self.config.data.image_size)

  @property
  def chunk(self):
    return int(self.config.recipe.chunk_size)


def first_frame(model, clip=None, image=None):
  """``(uint8 [S, S, 3], intrinsics [3, 3])``: eval clip ``clip``'s first frame, or ``image`` (uint8
  ``[H, W, 3]``: centre-cropped and resized) with the eval clips' intrinsics."""
  c = eval_clip(model.config, 0 if clip is None else clip)
  k = np.asarray(c["intrinsics"][0], np.float64)
  if image is None:
    return np.asarray(c["frames"][0], np.uint8), k
  from PIL import Image  # pylint: disable=g-import-not-at-top
  im = Image.fromarray(np.asarray(image, np.uint8)).convert("RGB")
  s = min(im.size)
  left, top = (im.width - s) // 2, (im.height - s) // 2
  size = model.image_size
  return np.asarray(im.crop((left, top, left + s, top + s)).resize((size, size), Image.BICUBIC)), k


class Player:
  """One walk. ``memory``: a policy name (:data:`jaxwm.memory.POLICIES`); ``steps``: Euler steps per chunk."""

  def __init__(self, model: Model, first, intrinsics, *, memory="landmark", steps=None, seed=0, controls=None):
    if memory not in POLICIES:
      raise ValueError(f"memory={memory!r}: must be one of {', '.join(POLICIES)}")
    steps = model.config.sample.num_steps if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
      raise ValueError(f"steps={steps!r}: must be an integer in [1, {MAX_STEPS}]")
    if model.config.data.get("source") == "records":
      raise ValueError("the viewer streams procedural-scene models; a records-trained (VAE) model is not supported "
                       "yet (sample.py streams it to an MP4)")
    self.m, self.memory_name, self.steps = model, memory, steps
    self.controls = controls or Controls()
    size, chunk = model.image_size, model.chunk
    self.policy = make_policy(memory, max_frames=model.max_frames, chunk_frames=chunk, image_hw=(size, size))
    sampler = make_sampler(model.model, model.variables, model.config, model.max_frames, num_steps=steps)
    self.k = np.asarray(intrinsics, np.float64)
    self.pose = np.eye(4)
    latent = vae.encode(jnp.asarray(np.asarray(first, np.uint8))[None, None], model.config.data.latent_stride)
    self.session = sampler.session(latent, jax.random.key(seed), self._cams(self.pose[None]), memory=self.policy,
                                   keep_frames=False)
    self.first = np.asarray(first, np.uint8)
    self._back = []  # poses of the way back still to fly

  def _cams(self, c2w):
    n = len(c2w)
    return {"c2w": jnp.asarray(c2w, jnp.float32)[None], "intrinsics": jnp.asarray(np.tile(self.k, (n, 1, 1)),
                                                                                  jnp.float32)[None]}

  @property
  def num_frames(self):
    return self.session.num_frames

  def room_left(self):
    """Frames the memory can still take (None: unbounded)."""
    return self.m.max_frames - self.num_frames if self.memory_name == "full" else None

  def step(self, keys=(), drag=(0.0, 0.0), back=False):
    """The next chunk: ``{"frames": uint8 [n, S, S, 3], "latency_s", "path": the chunk's ``[[x, z], ...]`` (top
    down), "resident": frame
    indices the memory keeps, "frame": index of the chunk's last frame, "returning": whether the way back
    goes on, "pose": :func:`pose_summary` of the chunk's last camera}``."""
    n = self.m.chunk
    left = self.room_left()
    if left is not None and left < n:
      raise ValueError(f"the full memory is full ({self.m.max_frames} frames): reset, or choose a bounded memory "
                       "(window, landmark, panorama)")
    if back and not self._back:  # as many frames as the held keys would take to undo the turn and the distance
      c = self.controls
      need = max(np.degrees(float(_angle(self.pose))) / c.turn if c.turn else 0.0,
                 float(np.linalg.norm(self.pose[:3, 3])) / c.speed if c.speed else 0.0, 1.0)
      self._back = list(return_path(self.pose, np.eye(4), int(np.ceil(need / n)) * n))
    if self._back:
      c2w, self._back = np.stack(self._back[:n]), self._back[n:]
    else:
      c2w = self.controls.chunk(self.pose, n, keys, drag)
    t0 = time.perf_counter()
    latents = self.session.next(self._cams(c2w))
    frames = np.asarray(vae.to_uint8(vae.decode(jnp.asarray(latents[0]), self.m.config.data.latent_stride)))
    latency = time.perf_counter() - t0
    self.pose = c2w[-1]
    return {"frames": frames, "latency_s": latency, "path": [[float(p[0, 3]), float(p[2, 3])] for p in c2w],
            "resident": [int(f) for f in self.policy.resident()], "frame": self.num_frames - 1,
            "returning": bool(self._back), "pose": pose_summary(self.pose)}


def pose_summary(c2w):
  """What the page shows of a camera-to-world pose (OpenCV: x right, y down, z forward): ``{"xyz": [x, y, z],
  "yaw": degrees of the view direction from +z towards +x, "pitch": degrees above the horizon (towards -y)}``."""
  c2w = np.asarray(c2w, np.float64)
  fx, fy, fz = c2w[:3, 2]
  return {"xyz": [round(float(v), 4) for v in c2w[:3, 3]], "yaw": round(math.degrees(math.atan2(fx, fz)), 3),
          "pitch": round(math.degrees(math.atan2(-fy, math.hypot(fx, fz))), 3)}


def _angle(c2w):
  from jaxwm.geometry.rotations import geodesic_angle  # pylint: disable=g-import-not-at-top
  return geodesic_angle(np.asarray(c2w)[:3, :3])
