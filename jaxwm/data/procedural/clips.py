"""Clips of the procedural dataset and the grain random-access data source.

A clip is a dict of numpy arrays:

- ``frames`` uint8 ``[F, H, W, 3]``; ``depth`` float32 ``[F, H, W]`` (z-depth, metres);
- ``c2w`` float32 ``[F, 4, 4]`` (OpenCV, scene world frame, y down); ``intrinsics`` float32
  ``[F, 3, 3]`` (pixels);
- metadata: ``scene_seed``, ``trajectory_seed`` (int64), ``family``, ``axes`` (str; ``""`` when
  not a rotation loop), ``magnitude_deg`` (float32; 0 when not a rotation loop),
  ``return_frame`` (int32; the frame whose pose equals frame 0, -1 if none).

Seeds are deterministic in ``(split, index)``: train uses even seeds, eval odd ones, so the
splits never share a scene or a trajectory.
"""

import dataclasses
import itertools

import numpy as np

from jaxwm.data.procedural import trajectories as traj
from jaxwm.data.procedural.render import render
from jaxwm.data.procedural.scene import make_scene

SPLITS = {"train": 0, "eval": 1}
FAMILY_WEIGHTS = {"rotate_loop": 0.4, "free": 0.3, "palindrome": 0.3}
EVAL_LOOPS = tuple(itertools.product(traj.AXIS_COMBOS, traj.MAGNITUDES_DEG))  # 35 (axes, magnitude) pairs


def pinhole_intrinsics(image_hw, fov_deg=70.0):
  """``[3, 3]`` pinhole intrinsics with horizontal field of view ``fov_deg`` and a centred principal point."""
  h, w = image_hw
  f = 0.5 * w / np.tan(np.radians(fov_deg) / 2)
  return np.array([[f, 0.0, w / 2.0], [0.0, f, h / 2.0], [0.0, 0.0, 1.0]], np.float32)


def make_trajectory(scene, trajectory_seed, num_frames, family, axes=None, magnitude_deg=None):
  """Poses and metadata for one clip of ``family`` (``rotate_loop``, ``free``, ``palindrome`` or a walk of
  :data:`jaxwm.data.procedural.trajectories.WALKS`).

  Returns:
    ``(c2w [F, 4, 4] float64, meta dict)``.
  """
  rng = np.random.default_rng(np.random.SeedSequence([0x7A7, int(trajectory_seed)]))
  start = traj.start_pose(rng, scene.camera_zone)
  meta = {"family": family, "axes": "", "magnitude_deg": 0.0, "return_frame": -1}
  if family == "rotate_loop":
    axes = axes or traj.AXIS_COMBOS[rng.integers(len(traj.AXIS_COMBOS))]
    magnitude_deg = float(magnitude_deg if magnitude_deg is not None else rng.choice(traj.MAGNITUDES_DEG))
    c2w, ret = traj.rotate_loop(start, axes, magnitude_deg, num_frames)
    meta.update(axes=axes, magnitude_deg=magnitude_deg, return_frame=ret)
  elif family == "free":
    c2w, _ = traj.free_path(rng, start, scene.camera_zone, num_frames)
  elif family in traj.WALKS:
    c2w = traj.walk(rng, scene.camera_zone, family, num_frames)
  elif family == "palindrome":
    path, _ = traj.free_path(rng, start, scene.camera_zone, (num_frames + 1) // 2)
    c2w, ret = traj.palindrome(path, num_frames)
    meta.update(return_frame=ret)
  else:
    raise ValueError(f"family must be one of {traj.FAMILIES + traj.WALKS}; got {family!r}")
  return c2w, meta


def make_clip(scene_seed, trajectory_seed, num_frames=17, image_hw=(64, 64), family="rotate_loop", axes=None,
              magnitude_deg=None, fov_deg=70.0):
  """Renders one clip (see module doc for the keys)."""
  scene = make_scene(int(scene_seed))
  c2w, meta = make_trajectory(scene, trajectory_seed, num_frames, family, axes, magnitude_deg)
  k = np.repeat(pinhole_intrinsics(image_hw, fov_deg)[None], num_frames, 0)
  frames, depth = render(scene, c2w, k, image_hw)
  return {
      "frames": frames,
      "depth": depth,
      "c2w": c2w.astype(np.float32),
      "intrinsics": k,
      "scene_seed": np.int64(scene_seed),
      "trajectory_seed": np.int64(trajectory_seed),
      "family": np.str_(meta["family"]),
      "axes": np.str_(meta["axes"]),
      "magnitude_deg": np.float32(meta["magnitude_deg"]),
      "return_frame": np.int32(meta["return_frame"]),
  }


@dataclasses.dataclass(frozen=True)
class ProceduralClips:
  """Grain random-access data source over procedural clips (``len`` and ``__getitem__``).

  Attributes:
    split: ``"train"`` or ``"eval"``.
    num_clips: length of the source.
    num_frames, image_hw, fov_deg: clip shape and camera.
    family: ``"mixed"`` (train default: :data:`FAMILY_WEIGHTS`), ``"loops"`` (each of the 35
      axis/magnitude rotation loops in turn: the eval benchmark), ``"walks"`` (each translation walk of
      :data:`jaxwm.data.procedural.trajectories.WALKS` in turn: the translation eval family) or one family name.
    clips_per_scene: consecutive indices sharing one room.
  """
  split: str = "train"
  num_clips: int = 1024
  num_frames: int = 17
  image_hw: tuple = (64, 64)
  family: str = "mixed"
  clips_per_scene: int = 1
  fov_deg: float = 70.0

  def __post_init__(self):
    if self.split not in SPLITS:
      raise ValueError(f"split must be one of {tuple(SPLITS)}; got {self.split!r}")
    if self.family not in ("mixed", "loops", "walks") + traj.FAMILIES + traj.WALKS:
      raise ValueError(f"family must be 'mixed', 'loops', 'walks' or one of {traj.FAMILIES + traj.WALKS}; "
                       f"got {self.family!r}")
    if self.num_frames < 3:
      raise ValueError(f"num_frames must be >= 3; got {self.num_frames}")

  def __len__(self):
    return self.num_clips

  def seeds(self, index):
    """``(scene_seed, trajectory_seed)`` of clip ``index``: even for train, odd for eval."""
    bit = SPLITS[self.split]
    return 2 * (index // self.clips_per_scene) + bit, 2 * index + bit

  def __getitem__(self, index):
    index = int(index)
    if not 0 <= index < self.num_clips:
      raise IndexError(f"index {index} out of range for {self.num_clips} clips")
    scene_seed, traj_seed = self.seeds(index)
    axes = magnitude = None
    family = self.family
    if family == "loops":
      family = "rotate_loop"
      axes, magnitude = EVAL_LOOPS[index % len(EVAL_LOOPS)]
    elif family == "walks":
      family = traj.WALKS[index % len(traj.WALKS)]
    elif family == "mixed":
      rng = np.random.default_rng(np.random.SeedSequence([0xFA31, traj_seed]))
      family = rng.choice(list(FAMILY_WEIGHTS), p=list(FAMILY_WEIGHTS.values()))
    return make_clip(scene_seed, traj_seed, self.num_frames, tuple(self.image_hw), str(family), axes, magnitude,
                     self.fov_deg)

  def __repr__(self):
    return (f"ProceduralClips(split={self.split!r}, num_clips={self.num_clips}, num_frames={self.num_frames}, "
            f"image_hw={tuple(self.image_hw)}, family={self.family!r})")
