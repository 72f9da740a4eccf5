"""TFDS builder for fixed train/eval splits of the procedural scenes (array_record, no TensorFlow).

Features are ``tfds.features.Tensor`` (not ``Image``) so that building and reading need
no TensorFlow. Read back with ``builder.as_data_source(split)`` (grain-compatible random
access) — see :func:`build` and :func:`load_source`.
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from jaxwm.data.procedural.clips import ProceduralClips


@dataclasses.dataclass
class ProceduralConfig(tfds.core.BuilderConfig):
  """Clip shape and split sizes. ``eval`` uses the 35 axis/magnitude rotation loops in turn."""
  image_hw: tuple = (64, 64)
  num_frames: int = 17
  num_train: int = 256
  num_eval: int = 35
  fov_deg: float = 70.0
  clips_per_scene: int = 1


CONFIGS = {
    "tiny": ProceduralConfig(name="tiny", description="64x64, 17 frames, 256 train / 35 eval clips",
                             image_hw=(64, 64), num_frames=17, num_train=256, num_eval=35),
    "loop128": ProceduralConfig(name="loop128", description="128x128, 61 frames, 2048 train / 175 eval clips",
                                image_hw=(128, 128), num_frames=61, num_train=2048, num_eval=175),
}


class ProceduralScenes(tfds.core.GeneratorBasedBuilder):
  """Ray-cast rooms with loop-closure camera trajectories and ground-truth depth."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = list(CONFIGS.values())

  def _info(self):
    c = self.builder_config
    h, w = c.image_hw
    f = c.num_frames
    T = tfds.features.Tensor  # pylint: disable=invalid-name
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "frames": T(shape=(f, h, w, 3), dtype=np.uint8),
            "depth": T(shape=(f, h, w), dtype=np.float32),
            "c2w": T(shape=(f, 4, 4), dtype=np.float32),
            "intrinsics": T(shape=(f, 3, 3), dtype=np.float32),
            "scene_seed": T(shape=(), dtype=np.int64),
            "trajectory_seed": T(shape=(), dtype=np.int64),
            "family": T(shape=(), dtype=np.str_),
            "axes": T(shape=(), dtype=np.str_),
            "magnitude_deg": T(shape=(), dtype=np.float32),
            "return_frame": T(shape=(), dtype=np.int32),
        }),
        description="Procedural loop-closure scenes of jaxwm (see jaxwm/data/procedural).",
        disable_shuffling=True,  # record i is clip i of the split
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    common = dict(num_frames=c.num_frames, image_hw=tuple(c.image_hw), fov_deg=c.fov_deg)
    return {
        "train": self._generate_examples(ProceduralClips("train", c.num_train, family="mixed",
                                                         clips_per_scene=c.clips_per_scene, **common)),
        "eval": self._generate_examples(ProceduralClips("eval", c.num_eval, family="loops", **common)),
    }

  def _generate_examples(self, source):
    for i in range(len(source)):
      clip = source[i]
      yield i, {k: (str(v) if isinstance(v, np.str_) else v) for k, v in clip.items()}


def build(data_dir, config="tiny", **overrides):
  """Builds (or reuses) the dataset under ``data_dir``; returns the builder.

  ``overrides`` replace fields of the named config (e.g. ``num_train=8``); the config then
  gets a derived name so that different shapes never share files.
  """
  cfg = CONFIGS[config]
  if overrides:
    cfg = dataclasses.replace(cfg, **overrides)
    cfg = dataclasses.replace(cfg, name=config + "_" + "_".join(f"{k}{_fmt(v)}" for k, v in sorted(overrides.items())))
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  level = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)  # TFDS warns about every derived config
  try:
    builder = ProceduralScenes(data_dir=str(data_dir), config=cfg, file_format="array_record")
  finally:
    absl_logging.set_verbosity(level)
  builder.download_and_prepare()
  return builder


def _fmt(v):
  return "x".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def load_source(builder, split):
  """Random-access data source (grain-compatible) over a built split."""
  return builder.as_data_source(split)
