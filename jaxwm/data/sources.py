"""Where clips come from (``data.source``): the procedural scenes rendered on the fly (``procedural``), their TFDS
build (``tfds``, the default), or clips ingested as latents (``records``, ``python -m jaxwm.data.ingest``); and the
shape of the latents each gives the model (:func:`latent_geometry`)."""

import logging
import os

from jaxwm.data.procedural import ProceduralClips

SOURCES = ("tfds", "procedural", "records")


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
