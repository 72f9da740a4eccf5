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
from jaxwm.sampling.clips import eval_clip
from jaxwm.sampling.controls import Controls, return_path
from jaxwm.sampling.settings import sample_of
from jaxwm.sampling.streaming import StreamingSampler

MAX_STEPS = 50
MAX_PROMPT = 1000  # characters


@dataclasses.dataclass
class Model:
  """A restored checkpoint (:func:`jaxwm.sampling.load.load_model`) and what the viewer needs of it: its
  autoencoder (``data.vae``: the lossless space-to-depth of procedural-scene models, or the video VAE a
  records-trained model's latents came from, decoded chunk by chunk as they stream), its frame size (the
  procedural ``data.image_size``, or the ingested dataset's from its manifest) and, for a text-conditioned model,
  its text encoder (``data.text_encoder``, loaded at the first prompt)."""
  config: object
  model: object
  variables: object
  step: int
  max_frames: int = 65  # the full memory's capacity (a walk under it ends there)
  frame_hw: tuple = None  # (H, W) of a records-trained model whose dataset is not here (default: its manifest's)

  def __post_init__(self):
    from jaxwm.data.sources import data_of  # pylint: disable=g-import-not-at-top
    from jaxwm.encoders import make_autoencoder  # pylint: disable=g-import-not-at-top
    self.autoencoder = make_autoencoder(data_of(self.config.data).autoencoder)
    self.frame_hw = _frame_hw(self.config, self.autoencoder, self.frame_hw,
                              tuple(self.model.cfg.patch_size[1:]))
    self._text = None

  @property
  def latent(self):
    """Whether the model was trained on ingested VAE latents (``data.source = "records"``)."""
    return self.config.data.get("source") == "records"

  @property
  def text(self):
    """Whether the model takes a prompt (``model.cross_attn``)."""
    return bool(self.model.cfg.cross_attn)

  @property
  def chunk(self):
    return int(self.config.recipe.chunk_size)

  def text_contexts(self, prompt):
    """``(context, null_context)`` ``[1, L, D]`` of ``prompt`` and of the empty prompt (text models)."""
    if self._text is None:
      from jaxwm.encoders import make_text_encoder  # pylint: disable=g-import-not-at-top
      self._text = make_text_encoder(self.config.data.text_encoder)
    from jaxwm.sampling.video import text_contexts  # pylint: disable=g-import-not-at-top
    return text_contexts(self._text, prompt)


def _frame_hw(config, ae, given=None, patch=(1, 1)):
  if config.data.get("source") != "records":
    if given is not None:
      raise ValueError(f"frame_hw={given!r}: only for a records-trained model (this one renders "
                       f"data.image_size={config.data.image_size} frames)")
    return int(config.data.image_size), int(config.data.image_size)
  import pathlib  # pylint: disable=g-import-not-at-top
  from jaxwm.data.records import read_manifest  # pylint: disable=g-import-not-at-top
  try:
    settings = read_manifest(pathlib.Path(config.data.data_dir).expanduser())["settings"]
    hw = int(settings["height"]), int(settings["width"])
  except (OSError, ValueError, KeyError, TypeError):
    hw = None
  if given is not None:
    h, w = (int(v) for v in given)
    if hw is not None:
      raise ValueError(f"frame_hw={given!r}: data.data_dir={config.data.data_dir!r} holds the dataset, whose "
                       f"manifest gives the size ({hw[0]}x{hw[1]}): drop it")
    sh, sw = ae.spatial_stride * patch[0], ae.spatial_stride * patch[1]
    if h < sh or w < sw or h % sh or w % sw:
      raise ValueError(f"frame_hw={given!r}: must be positive multiples of {sh}x{sw} (the spatial stride of "
                       f"{ae.name} times model.patch_size)")
    return h, w
  if hw is None:
    raise ValueError(f"data.data_dir={config.data.data_dir!r}: the ingested dataset's manifest is not readable "
                     f"here, and the viewer takes the frame size from it (for {ae.name}, multiples of "
                     f"{ae.spatial_stride}); copy manifest.json there or give the size (jaxwm-play --frame-size HxW)")
  return hw


def first_frame(model, clip=None, image=None):
  """``(uint8 [H, W, 3], intrinsics [3, 3])`` at the model's frame size: eval scene ``clip``'s first frame, or
  ``image`` (uint8 ``[h, w, 3]``: centre-cropped to the frame's aspect and resized) with the eval scenes'
  intrinsics (a 70-degree pinhole)."""
  h, w = model.frame_hw
  clip = 0 if clip is None else clip
  if model.latent:  # the procedural eval scene rendered at the ingested frame size
    from jaxwm.data.procedural import ProceduralClips  # pylint: disable=g-import-not-at-top
    c = ProceduralClips("eval", num_clips=clip + 1, num_frames=3, image_hw=(h, w), family="loops")[clip]
  else:
    c = eval_clip(model.config, clip)
  k = np.asarray(c["intrinsics"][0], np.float64)
  if image is None:
    return np.asarray(c["frames"][0], np.uint8), k
  from PIL import Image  # pylint: disable=g-import-not-at-top
  im = Image.fromarray(np.asarray(image, np.uint8)).convert("RGB")
  cw, ch = min(im.width, im.height * w / h), min(im.height, im.width * h / w)
  left, top = (im.width - cw) / 2, (im.height - ch) / 2
  return np.asarray(im.crop((round(left), round(top), round(left + cw), round(top + ch))).resize(
      (w, h), Image.BICUBIC)), k


class Player:
  """One walk. ``memory``: a policy name (:data:`jaxwm.memory.POLICIES`); ``steps``: Euler steps per chunk;
  ``prompt``: the text of a text-conditioned model (classifier-free guidance at the checkpoint's
  ``sample.guidance``)."""

  def __init__(self, model: Model, first, intrinsics, *, memory="landmark", steps=None, seed=0, controls=None,
               prompt=""):
    if memory not in POLICIES:
      raise ValueError(f"memory={memory!r}: must be one of {', '.join(POLICIES)}")
    steps = model.config.sample.num_steps if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
      raise ValueError(f"steps={steps!r}: must be an integer in [1, {MAX_STEPS}]")
    if not isinstance(prompt, str) or len(prompt) > MAX_PROMPT:
      raise ValueError(f"prompt={prompt!r:.40}: must be text of at most {MAX_PROMPT} characters")
    if prompt and not model.text:
      raise ValueError(f"prompt={prompt!r:.40}: this model has no text conditioning (model.cross_attn is off)")
    self.m, self.memory_name, self.steps = model, memory, steps
    self.controls = controls or Controls()
    (h, w), chunk, ae = model.frame_hw, model.chunk, model.autoencoder
    first = np.asarray(first, np.uint8)
    if first.shape != (h, w, 3):
      raise ValueError(f"first frame is {first.shape}; this model streams {h}x{w} RGB frames")
    self.policy = make_policy(memory, max_frames=model.max_frames, chunk_frames=chunk, image_hw=(h, w))
    context = null = None
    guidance = 1.0
    if model.text:
      context, null = model.text_contexts(prompt)
      guidance = float(model.config.sample.get("guidance", 1.0))
    lh, lw = h // ae.spatial_stride, w // ae.spatial_stride
    sampler = StreamingSampler(model.model, model.variables, batch_size=1, max_frames=model.max_frames,
                               latent_hw=(lh, lw), channels=ae.channels, num_steps=steps,
                               shift=model.config.sample.shift, guidance=guidance, context=context,
                               null_context=null, noise_scale=sample_of(model.config.sample).noise_scale)
    self.k = np.asarray(intrinsics, np.float64)
    self.pose = np.eye(4)
    latent = ae.encode(jnp.asarray(first)[None, None])  # [1, 1, h, w, C]: the image alone
    self.decoder = ae.decoder(1, lh, lw)
    self.decoder.step(latent)  # the causal decoder's cache starts at the first frame, as in stream_video
    self.session = sampler.session(latent, jax.random.key(seed), self._cams(self.pose[None]), memory=self.policy,
                                   keep_frames=False)
    self.first = first
    self._back = []  # poses of the way back still to fly

  def _cams(self, c2w):
    n = len(c2w)  # built on the host: each eager op on a device array costs a dispatch per chunk
    return {"c2w": np.asarray(c2w, np.float32)[None], "intrinsics": np.tile(self.k, (1, n, 1, 1)).astype(np.float32)}

  @property
  def num_frames(self):
    return self.session.num_frames

  def room_left(self):
    """Frames the memory can still take (None: unbounded)."""
    return self.m.max_frames - self.num_frames if self.memory_name == "full" else None

  def step(self, keys=(), drag=(0.0, 0.0), back=False):
    """The next chunk: ``{"frames": uint8 [n * t, H, W, 3]`` (``t``: the autoencoder's temporal stride),
    ``"latency_s", "path": the chunk's ``[[x, z], ...]`` (top
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
    frames = self.decoder.step(latents)[0]
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
