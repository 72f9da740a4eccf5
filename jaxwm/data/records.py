"""Clip records in array_record shards (written by ``jaxwm.data.ingest``): the record format, a
grain random-access source over a split, and the latent window op.

Record format, version 1: one ``np.savez`` archive (no pickles) per clip, with

- ``version`` int32 scalar, 1;
- ``latents`` float32 or float16 ``[F', h, w, C]``: ``F' = 1 + (F - 1) // temporal_stride``
  latent frames of the clip's ``F`` pixel frames (a causal video VAE: the first frame alone,
  then groups of ``temporal_stride``);
- ``c2w`` float64 ``[F', 4, 4]``: OpenCV camera-to-world per latent frame, metres, in the
  source's world frame (not re-anchored): pixel frame 0, then the SE(3) mean of each group
  (``jaxwm.data.ingest.latent_cameras``);
- ``intrinsics`` float32 ``[F', 3, 3]``: pixels of the stored frame size ``(H, W)``;
- ``first_frame`` uint8 ``[H, W, 3]``: the clip's first RGB frame (TI2V conditioning, evaluation);
- ``source_frames`` int64 ``[F]``: indices of the clip's pixel frames among the decoded video frames;
- ``caption`` str scalar (``""`` when none); ``text_emb`` ``[L, D]`` (only with a text encoder);
- ``meta`` str scalar: JSON with ``video``, ``stem``, ``split``, ``clip``, ``start_frame``,
  ``source_fps``, ``fps``, ``stride``, ``image_hw``, ``vae``, ``temporal_stride``,
  ``latent_shape``, ``camera_file``, ``text_encoder``.

A dataset directory holds ``<split>-<nnnnn>.array_record`` shards (one record per clip, group
size 1), ``manifest.json``, which lists finished shards only, and with a text encoder
``null_text_emb.npy`` (the empty prompt's ``[L, D]`` embedding: captionless clips, text dropout).
"""

import io
import json
import pathlib
import threading

import grain.python as grain
import numpy as np

from jaxwm.data.window import ClipWindow

RECORD_VERSION = 1
MANIFEST = "manifest.json"
NULL_TEXT = "null_text_emb.npy"  # [L, D]: the text encoder's embedding of the empty prompt (with a text encoder)
STRING_KEYS = ("caption", "meta")
# numpy parses .npy headers with ast.literal_eval, which CPython 3.11 does not make thread-safe
# ("SystemError: AST constructor recursion depth mismatch"); grain decodes records in a thread pool.
_NPY_HEADER_LOCK = threading.Lock()


def encode_record(clip):
  """A dict of arrays (the keys of the module doc, without ``version``) -> ``np.savez`` bytes."""
  arrays = {"version": np.int32(RECORD_VERSION)}
  for key, value in clip.items():
    arrays[key] = np.asarray(value, dtype=np.str_) if key in STRING_KEYS else np.asarray(value)
    if arrays[key].dtype == object:
      raise ValueError(f"record key {key!r} is an object array; records hold numeric arrays and strings only")
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  return buf.getvalue()


def decode_record(data):
  """Inverse of :func:`encode_record`: dict of numpy arrays (strings as ``np.str_``)."""
  with _NPY_HEADER_LOCK, np.load(io.BytesIO(data), allow_pickle=False) as z:
    out = {k: z[k] for k in z.files}
  version = int(out.pop("version", -1))
  if version != RECORD_VERSION:
    raise ValueError(f"record version {version} is not supported (expected {RECORD_VERSION})")
  for key in STRING_KEYS:
    if key in out:
      out[key] = np.str_(out[key][()])
  return out


def read_manifest(directory):
  """The ``manifest.json`` of a dataset directory (a dict), or None when there is none."""
  path = pathlib.Path(directory) / MANIFEST
  return json.loads(path.read_text()) if path.is_file() else None


def _opens(path):
  try:
    grain.ArrayRecordDataSource([str(path)])
    return True
  except Exception:  # pylint: disable=broad-except
    return False


class DamagedRecordError(ValueError):
  """A record or shard of an ingested dataset that cannot be read: the message names the shard file."""


class RecordClips:
  """Grain random-access source over the finished shards of one split of an ingested dataset.

  ``source[i]`` is a dict of numpy arrays, the record format of the module doc (``meta`` a JSON
  string). ``settings`` is the ingestion's settings (image size, vae, strides, ...).
  """

  def __init__(self, directory, split="train"):
    self.directory, self.split = pathlib.Path(directory), split
    manifest = read_manifest(self.directory)
    if manifest is None:
      raise ValueError(f"{self.directory} has no {MANIFEST} (not an ingested dataset, or nothing finished yet)")
    shards = [s["file"] for s in manifest["shards"] if s["split"] == split]
    if not shards:
      splits = sorted({s["split"] for s in manifest["shards"]})
      raise ValueError(f"{self.directory} has no finished shards of split {split!r}; it has {splits}")
    self.settings = manifest["settings"]
    self.latent_shape = tuple(manifest["latent_shape"])
    self._shards = shards
    self._starts = np.cumsum([0] + [s["num_clips"] for s in manifest["shards"] if s["split"] == split])
    try:
      self._source = grain.ArrayRecordDataSource([str(self.directory / f) for f in shards])
    except Exception as e:  # pylint: disable=broad-except  (array_record raises its runtime's errors)
      bad = next((f for f in shards if not _opens(self.directory / f)), "one of its shards")
      raise DamagedRecordError(f"{self.directory}: shard {bad} of split {split!r} cannot be opened "
                               f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); re-ingest that shard or "
                               "remove it from manifest.json") from None

  def null_text(self):
    """The empty prompt's embedding ``[L, D]`` (None without a text encoder)."""
    path = self.directory / NULL_TEXT
    return np.load(path) if path.is_file() else None

  def __len__(self):
    return len(self._source)

  def __getitem__(self, index):
    try:
      return decode_record(self._source[index])
    except Exception as e:  # pylint: disable=broad-except  (array_record and numpy raise several kinds)
      shard = int(np.searchsorted(self._starts, int(index), side="right")) - 1
      where = (f"shard {self._shards[shard]} (record {int(index) - int(self._starts[shard])} of it)"
               if 0 <= shard < len(self._shards) else "no shard")
      raise DamagedRecordError(f"{self.directory}: record {int(index)} of split {self.split!r}, {where}, is "
                               f"unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]}); re-ingest "
                               "that shard or remove it from manifest.json") from None

  def __repr__(self):
    return f"RecordClips({str(self.directory)!r}, split={self.split!r}, num_clips={len(self)})"


class LatentWindow(grain.RandomMapTransform):
  """A window of ``num_frames`` latent frames at ``frame_stride`` from a :class:`RecordClips` record.

  The window's indices, palindromes, re-anchoring on its first frame and ``scale_divisor`` are
  :class:`jaxwm.data.window.ClipWindow`'s.

  Args:
    from_start: the window starts at latent frame 0, the record's ``first_frame`` (needed with a
      causal VAE, whose later latent frames are not encodings of a lone first frame).

  Output: ``latents [T, h, w, C]``, ``c2w`` float32 ``[T, 4, 4]`` (re-anchored),
  ``intrinsics`` float32 ``[T, 3, 3]``, ``latent_index`` int32 ``[T]``, ``caption``,
  ``text_emb`` (when stored) and, with ``from_start``, ``first_frame``.
  """

  def __init__(self, num_frames, frame_stride=1, palindrome_prob=0.0, scale_divisor=1.0, from_start=False):
    self.from_start = from_start
    self._window = ClipWindow(num_frames, frame_stride, 1, palindrome_prob=palindrome_prob,
                              scale_divisor=scale_divisor, convention="opencv")

  def random_map(self, record, rng):
    idx = self._window.window_indices(len(record["latents"]), rng, start=0 if self.from_start else None)
    c2w, k = self._window.window_cameras(record["c2w"], record["intrinsics"], idx)
    out = {"latents": np.asarray(record["latents"])[idx], "c2w": c2w, "intrinsics": k,
           "latent_index": idx.astype(np.int32), "caption": record["caption"]}
    if "text_emb" in record:
      out["text_emb"] = record["text_emb"]
    if self.from_start:
      out["first_frame"] = record["first_frame"]
    return out
