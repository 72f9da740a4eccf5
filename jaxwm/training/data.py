"""grain input pipeline: sources (the procedural scenes, their TFDS build, or ingested latent records) and
batched loaders of windows (:class:`jaxwm.data.window.ClipWindow` over frames,
:class:`jaxwm.data.records.LatentWindow` over stored latents)."""

import logging
import os

import grain.python as grain
import numpy as np

from jaxwm.data.procedural import ProceduralClips
from jaxwm.data.window import ClipWindow


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
  raise ValueError(f"data.source must be 'tfds', 'procedural' or 'records'; got {data_cfg.source!r}")


class _Arrays(grain.MapTransform):
  """Drops a window's strings (captions): batches hold arrays only."""

  def map(self, element):
    return {k: v for k, v in element.items() if not isinstance(v, (str, np.str_))}


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


def window_op(data_cfg, split, source):
  """The window transform of ``source`` (records: latent windows, from the first latent frame when the VAE is
  temporally causal; otherwise pixel windows)."""
  pal = data_cfg.get("palindrome_prob", 0.0) if split == "train" else 0.0
  if data_cfg.source == "records":
    from jaxwm.data.records import LatentWindow  # pylint: disable=g-import-not-at-top
    causal = int(source.settings.get("temporal_stride", 1) or 1) > 1
    return LatentWindow(data_cfg.num_frames, data_cfg.frame_stride, palindrome_prob=pal,
                        scale_divisor=data_cfg.get("scale_divisor", 1.0), from_start=causal)
  return ClipWindow(data_cfg.num_frames, data_cfg.frame_stride, data_cfg.image_size, palindrome_prob=pal,
                    scale_divisor=data_cfg.get("scale_divisor", 1.0), convention=data_cfg.get("convention", "opencv"))


def make_loader(data_cfg, seed, batch_size_per_process, split="train", num_epochs=None, shard=True):
  """A ``grain.DataLoader`` of batches (a dict of stacked arrays); its iterator state is checkpointable.

  ``shard``: True reads this JAX process's share of the records, False all of them, or a
  ``grain.ShardOptions`` names the share (e.g. to replay another process's data).
  """
  source = make_source(data_cfg, split)
  if isinstance(shard, bool):
    shard = grain.ShardByJaxProcess(drop_remainder=True) if shard else grain.NoSharding()
  sampler = grain.IndexSampler(
      num_records=len(source),
      shard_options=shard,
      shuffle=True, num_epochs=num_epochs, seed=seed)
  ops = [window_op(data_cfg, split, source), _Arrays(), grain.Batch(batch_size_per_process, drop_remainder=True)]
  return grain.DataLoader(data_source=source, sampler=sampler, operations=ops, worker_count=data_cfg.worker_count)
