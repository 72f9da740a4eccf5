"""Where clips come from (``data.source``): the procedural scenes rendered on the fly (``procedural``), their TFDS
build (``tfds``, the default), or clips ingested as latents (``records``, ``python -m jaxwm.data.ingest``); and the
shape of the latents each gives the model (:func:`latent_geometry`)."""

import dataclasses
import logging
import os

from jaxwm.data.procedural import ProceduralClips
from jaxwm.settings import Block, Choice, Float, Int, Str, setting

SOURCES = ("tfds", "procedural", "records")
CONVENTIONS = ("opencv", "opengl")


@dataclasses.dataclass(frozen=True)
class DataConfig(Block):
  """The ``data`` block (a resume may change any key but ``image_size`` and ``latent_stride``, which shape the
  parameters; changes are logged).

  Attributes:
    source: :data:`SOURCES`: ``tfds`` (the procedural scenes built once into ``data_dir``), ``procedural``
      (rendered on the fly) or ``records`` (``python -m jaxwm.data.ingest``; ``data_dir`` is the ingested folder).
    data_dir: the TFDS build's folder, or the ingested dataset.
    num_clips, clips_per_scene: training clips of the procedural scenes, and clips per room.
    clip_frames, render_size: frames per rendered clip, and their size (pixels).
    image_size: training frame size (rendered frames are area-downsampled to it).
    latent_stride: pixels per latent pixel (space-to-depth, or the VAE's).
    num_frames, frame_stride: latent frames per training window (``1 + k * recipe.chunk_size``) and their spacing.
    batch_size: the global batch; 0 makes it ``per_device_batch_size`` x the devices the batch is split over.
    per_device_batch_size: see ``batch_size``.
    worker_count: grain worker processes (0: in the main process).
    read_ahead: batches read beyond those the loop has taken, per process (per grain worker when ``worker_count``
      > 0): grain's prefetch buffer, with one reader thread per record up to 16. Raise it for slow storage such
      as a remote bucket. Only speed depends on it, never which records come in what order.
    palindrome_prob: probability of a palindromic window (out and back: the way back revisits the way out).
    scale_divisor: translations are divided by it (per-source scale).
    convention: the source's camera convention (:data:`CONVENTIONS`).
    vae: the autoencoder of the latents (:mod:`jaxwm.encoders`; rendered frames: ``space_to_depth:<stride>``).
    text_encoder: the text encoder of the records' embeddings (:mod:`jaxwm.encoders`; ``none``).
  """
  PREFIX = "data"
  source: str = setting("tfds", Choice(SOURCES))
  data_dir: str = setting("data/tfds", Str())
  num_clips: int = setting(256, Int(lo=1))
  clips_per_scene: int = setting(8, Int(lo=1))
  clip_frames: int = setting(17, Int(lo=1))
  render_size: int = setting(64, Int(lo=1))
  image_size: int = setting(32, Int(lo=1), resume="refused")
  latent_stride: int = setting(4, Int(lo=1), resume="refused")
  num_frames: int = setting(9, Int(lo=1))
  frame_stride: int = setting(2, Int(lo=1))
  batch_size: int = setting(0, Int(lo=0, allowed="must be an integer >= 0 (the global batch; 0: "
                                                  "data.per_device_batch_size x devices)"))
  per_device_batch_size: int = setting(4, Int(lo=0), absent=0)
  worker_count: int = setting(0, Int(lo=0))
  read_ahead: int = setting(2, Int(lo=1))
  palindrome_prob: float = setting(0.25, Float(ge=0, le=1), absent=0.0)
  scale_divisor: float = setting(1.0, Float(gt=0))
  convention: str = setting("opencv", Choice(CONVENTIONS))
  vae: str = setting("space_to_depth:4", Str(nonempty=True), absent="")
  text_encoder: str = setting("none", Str(nonempty=True))

  @property
  def autoencoder(self):
    """The autoencoder's name (configs saved before ``vae`` existed: space-to-depth at ``latent_stride``)."""
    return self.vae or f"space_to_depth:{self.latent_stride}"


def data_of(block):
  """A :class:`DataConfig` from a ``data`` block (a saved config's missing keys read as they meant then)."""
  return block if isinstance(block, DataConfig) else DataConfig.from_dict(block, legacy=True)


def make_source(data_cfg, split="train"):
  """The random-access source: the built TFDS split (``data.source = "tfds"``) or on-the-fly rendering."""
  common = dict(num_frames=data_cfg.clip_frames, image_hw=(data_cfg.render_size, data_cfg.render_size))
  if data_cfg.source == "procedural":
    return ProceduralClips(split, data_cfg.num_clips if split == "train" else 35,
                           family="mixed" if split == "train" else "loops",
                           clips_per_scene=data_cfg.clips_per_scene if split == "train" else 1, **common)
  if data_cfg.source == "records":
    from jaxwm.data.records import RecordClips  # pylint: disable=g-import-not-at-top
    return RecordClips(os.path.expanduser(data_cfg.data_dir), split)
  if data_cfg.source == "tfds":
    from jaxwm.data.procedural.tfds_builder import build, load_source  # pylint: disable=g-import-not-at-top
    builder = build(os.path.expanduser(data_cfg.data_dir), "tiny", num_train=data_cfg.num_clips, num_eval=35,
                    image_hw=common["image_hw"], num_frames=data_cfg.clip_frames,
                    clips_per_scene=data_cfg.clips_per_scene)
    logging.info("dataset %s at %s", builder.info.full_name, builder.data_dir)
    return load_source(builder, split)
  raise ValueError(f"data.source must be one of {SOURCES}; got {data_cfg.source!r}")


def latent_geometry(data_cfg):
  """``(h, w, C)`` of the model's latents: space-to-depth of ``data.image_size`` frames, or the ingested
  records' (their ``manifest.json``)."""
  if data_cfg.source == "records":
    from jaxwm.data.records import read_manifest  # pylint: disable=g-import-not-at-top
    manifest = read_manifest(os.path.expanduser(data_cfg.data_dir))
    if manifest is None or not manifest.get("latent_shape"):
      raise ValueError(f"data.data_dir={data_cfg.data_dir!r}: no ingested clips (no manifest.json with a latent "
                       "shape); run python -m jaxwm.data.ingest first")
    _, h, w, c = manifest["latent_shape"]
    return h, w, c
  s = data_cfg.image_size // data_cfg.latent_stride
  return s, s, 3 * data_cfg.latent_stride**2
