"""grain input pipeline: sources (the procedural scenes, their TFDS build, or ingested latent records) and
batched loaders of windows (:class:`jaxwm.data.window.ClipWindow` over frames,
:class:`jaxwm.data.records.LatentWindow` over stored latents)."""


import grain.python as grain
import numpy as np

from jaxwm.data.sources import data_of, make_source
from jaxwm.data.window import ClipWindow


class _Arrays(grain.MapTransform):
  """Drops a window's strings (captions): batches hold arrays only."""

  def map(self, element):
    return {k: v for k, v in element.items() if not isinstance(v, (str, np.str_))}


def window_op(data_cfg, split, source):
  """The window transform of ``source`` (records: latent windows, from the first latent frame when the VAE is
  temporally causal; otherwise pixel windows)."""
  data_cfg = data_of(data_cfg)
  pal = data_cfg.palindrome_prob if split == "train" else 0.0
  if data_cfg.source == "records":
    from jaxwm.data.records import LatentWindow  # pylint: disable=g-import-not-at-top
    causal = int(source.settings.get("temporal_stride", 1) or 1) > 1
    return LatentWindow(data_cfg.num_frames, data_cfg.frame_stride, palindrome_prob=pal,
                        scale_divisor=data_cfg.scale_divisor, from_start=causal)
  return ClipWindow(data_cfg.num_frames, data_cfg.frame_stride, data_cfg.image_size, palindrome_prob=pal,
                    scale_divisor=data_cfg.scale_divisor, convention=data_cfg.convention)


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
  # grain's default reads 500 records ahead on 16 threads: a short run renders many times the clips it uses.
  ahead = data_of(data_cfg).read_ahead * batch_size_per_process
  return grain.DataLoader(data_source=source, sampler=sampler, operations=ops, worker_count=data_cfg.worker_count,
                          read_options=grain.ReadOptions(num_threads=min(16, ahead), prefetch_buffer_size=ahead))
