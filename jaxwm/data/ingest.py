"""Videos + camera files (+ captions) -> clip records in array_record shards.

  python -m jaxwm.data.ingest --videos vids/ --cameras cams/ --captions captions.jsonl --out data/re10k \\
      --height 64 --width 64 --stride 2 --clip_frames 17 [--vae space_to_depth] [--text_encoder none]

Inputs are matched by file stem: ``vids/<stem>.mp4`` (any of ``.mp4 .mov .mkv .avi .webm .m4v``)
with ``cams/<stem>.{txt,json,npy,npz}`` or ``cams/<stem>/transforms.json`` (formats of
``jaxwm.geometry.camera_files``; one pose per decoded video frame) and an optional caption: a
JSON object ``{stem: caption}``, a JSONL file of ``{"stem": ..., "caption": ...}`` lines, or a
directory of ``<stem>.txt`` (not the camera directory). ``--cameras`` defaults to ``--videos``.

Each video is decoded, resized + centre-cropped to ``--height x --width`` (intrinsics adjusted),
resampled to ``--fps`` or every ``--stride``-th frame (default: every frame), and cut into
clips of ``--clip_frames`` frames every ``--hop`` frames (default: ``--clip_frames``, no overlap).
Clips are encoded in batches by a :class:`LatentEncoder` (``--vae``: ``space_to_depth[:S]`` or
a plug-in ``module:factory`` / ``file.py:factory`` returning one) and optionally a
:class:`CaptionEncoder` (``--text_encoder``), and written as records (``jaxwm.data.records``), one
shard file per ``--shard_size`` clips, each written to a temporary name then renamed.
``manifest.json`` lists the finished shards; a second run skips videos whose clips are all in
finished shards. Bad inputs are skipped with a reason in ``rejects.jsonl`` (delete a line to
retry that video). Every argument is checked first: a refusal is one line and exit code 2.

Many processes (the hosts of a pod: ``--distributed``, or ``--process_index i --process_count n``) ingest one
folder together, each taking every n-th video, and the last to finish merges the manifest
(:mod:`jaxwm.data.ingest_parts`).
"""

import collections
import importlib
import importlib.util
import json
import os
import pathlib
import re
import sys

import numpy as np

from jaxwm.data import ingest_parts, records
from jaxwm.data.video import VIDEO_SUFFIXES, adjust_intrinsics, read_video, resample_indices
from jaxwm.encoders import autoencoder_strides, caption_encoder, latent_encoder, space_to_depth_encoder
from jaxwm.encoders import CaptionEncoder as TextEncoder  # noqa: F401  (the name plug-ins used before jaxwm.encoders)
from jaxwm.encoders import LatentEncoder  # noqa: F401  (the name plug-ins used before jaxwm.encoders)
from jaxwm.geometry import camera_files
from jaxwm.geometry.rotations import downsample_poses
from jaxwm.settings import Choice, ConfigError, Float, Int
from jaxwm.utils.cli import IsDir, Parser, Refusal, write_json
from jaxwm.utils.cli import run as run_cli

FORMAT = "jaxwm.clips"
REJECTS = "rejects.jsonl"
DTYPES = ("float32", "float16")


def latent_cameras(c2w, intrinsics, temporal_stride):
  """Cameras per latent frame: pixel frame 0 alone, then one per group of ``temporal_stride``
  frames (``1 + s(j-1) .. s j``): rotations by the chordal mean projected on SO(3) and
  translations by the mean (``jaxwm.geometry.rotations.downsample_poses``); intrinsics by the mean.

  Args:
    c2w: ``[F, 4, 4]`` with ``F = 1 + k * temporal_stride``; intrinsics: ``[F, 3, 3]``.

  Returns:
    ``(c2w [F', 4, 4] float64, intrinsics [F', 3, 3] float64)`` with ``F' = 1 + k``.
  """
  c2w, k = np.asarray(c2w, np.float64), np.asarray(intrinsics, np.float64)
  s = int(temporal_stride)
  if (len(c2w) - 1) % s:
    raise ValueError(f"{len(c2w)} frames are not 1 + k * {s}")
  if s == 1:
    return c2w, k
  groups = k[1:].reshape(-1, s, 3, 3).mean(axis=1)
  return np.concatenate([c2w[:1], downsample_poses(c2w[1:], s)]), np.concatenate([k[:1], groups])


def load_plugin(spec, flag):
  """``module.path:factory`` or ``path/file.py:factory`` -> ``factory()``."""
  if ":" not in spec:
    raise SettingsError(f"{flag}={spec!r}: expected a built-in name or 'module:factory' / 'file.py:factory' (loading "
                     f"weights from a path is left to a plug-in factory)")
  mod_name, attr = spec.rsplit(":", 1)
  try:
    if mod_name.endswith(".py"):
      s = importlib.util.spec_from_file_location(pathlib.Path(mod_name).stem, mod_name)
      module = importlib.util.module_from_spec(s)
      s.loader.exec_module(module)
    else:
      module = importlib.import_module(mod_name)
    return getattr(module, attr)()
  except Exception as e:  # pylint: disable=broad-except
    raise SettingsError(f"{flag}={spec!r}: cannot load ({type(e).__name__}: {' '.join(str(e).split())})") from None


def make_encoder(spec):
  """``--vae``: ``space_to_depth`` (stride 4), ``space_to_depth:S``, a Wan VAE (``wan2.2:<weights>``,
  ``wan2.1:<weights>``, ``wan2.2-tiny:<seed>``: :mod:`jaxwm.encoders`) or a plug-in returning a
  :class:`jaxwm.encoders.LatentEncoder`."""
  m = re.fullmatch(r"space_to_depth(?::(\d+))?", spec)
  if m:
    return space_to_depth_encoder(int(m.group(1) or 4))
  if re.match(r"wan2\.[12](-tiny)?:", spec):
    try:
      return latent_encoder(spec)
    except (ValueError, OSError, KeyError) as e:
      raise SettingsError(f"--vae={spec!r}: {' '.join(str(e).split())}") from None
  enc = load_plugin(spec, "--vae")
  ok = (callable(getattr(enc, "fn", None)) and isinstance(getattr(enc, "name", None), str)
        and all(isinstance(getattr(enc, a, None), int) and getattr(enc, a) >= 1
                for a in ("temporal_stride", "spatial_stride")))
  if not ok:
    raise SettingsError(f"--vae={spec!r}: the factory must return a LatentEncoder (name, fn, temporal_stride >= 1, "
                     f"spatial_stride >= 1); got {type(enc).__name__}")
  return enc


def make_text_encoder(spec):
  """``--text_encoder``: ``none``, umT5 (``umt5:<tokenizer>,<weights>``, ``umt5-tiny:<seed>``:
  :func:`jaxwm.encoders.make_text_encoder`) or a plug-in returning a :class:`jaxwm.encoders.CaptionEncoder`."""
  if spec in (None, "none"):
    return None
  if re.match(r"umt5(-tiny)?:", spec):
    try:
      return caption_encoder(spec)
    except (ValueError, OSError, KeyError) as e:
      raise SettingsError(f"--text_encoder={spec!r}: {' '.join(str(e).split())}") from None
  enc = load_plugin(spec, "--text_encoder")
  if not (callable(getattr(enc, "fn", None)) and isinstance(getattr(enc, "name", None), str)):
    raise SettingsError(f"--text_encoder={spec!r}: the factory must return a CaptionEncoder (name, fn); "
                     f"got {type(enc).__name__}")
  return enc


def load_captions(path, cameras_dir=None):
  """``{stem: caption}`` from a JSON object, a JSONL file or a directory of ``<stem>.txt`` (see module doc)."""
  if path is None:
    return {}
  p = pathlib.Path(path)
  if p.is_dir():
    if cameras_dir is not None and p.resolve() == pathlib.Path(cameras_dir).resolve():
      raise SettingsError(f"--captions={str(path)!r}: is the camera directory (whose <stem>.txt are RealEstate10K "
                       f"cameras); put captions elsewhere")
    return {f.stem: f.read_text().strip() for f in sorted(p.glob("*.txt"))}
  if not p.is_file():
    raise SettingsError(f"--captions={str(path)!r}: no such file or directory")
  text = p.read_text()
  try:
    if p.suffix.lower() == ".jsonl":
      out = {}
      for n, line in enumerate(text.splitlines()):
        if line.strip():
          d = json.loads(line)
          out.update({str(d["stem"]): str(d["caption"])} if "caption" in d else {str(k): str(v) for k, v in d.items()})
      return out
    d = json.loads(text)
  except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as e:
    where = f" line {n + 1}" if p.suffix.lower() == ".jsonl" else ""
    raise SettingsError(f"--captions={str(path)!r}:{where} not a stem -> caption mapping "
                        f"({type(e).__name__}: {e})") from None
  if not isinstance(d, dict):
    raise SettingsError(f"--captions={str(path)!r}: a JSON captions file must hold one object {{stem: caption}}")
  return {str(k): str(v) for k, v in d.items()}


def find_camera_file(cameras_dir, stem):
  """The camera file of video ``stem`` (see module doc); raises ``ValueError`` when none or several."""
  d = pathlib.Path(cameras_dir)
  found = [p for p in [d / f"{stem}{s}" for s in camera_files.SUFFIXES] + [d / stem / "transforms.json"]
           if p.is_file()]
  if not found:
    raise ValueError(f"missing camera file: no {stem}{{{','.join(camera_files.SUFFIXES)}}} or "
                     f"{stem}/transforms.json in {d}")
  if len(found) > 1:
    raise ValueError(f"ambiguous camera files: {', '.join(p.name for p in found)}")
  return found[0]


class _Name:
  """Letters, digits or ``_`` (a split names the shard files)."""

  def __call__(self, key, v):
    if not isinstance(v, str) or re.fullmatch(r"[A-Za-z0-9_]+", v) is None:
      raise ConfigError(key, v, "must be letters, digits or _ (it names the shard files)")
    return v


class _OutDir:

  def __call__(self, key, v):
    if pathlib.Path(v).exists() and not pathlib.Path(v).is_dir():
      raise ConfigError(key, v, "exists and is not a directory")
    return v


# Each flag's own check: the parser's (before any encoder is built) and ingest()'s.
FLAG_CHECKS = {"videos": IsDir(), "cameras": IsDir(), "out": _OutDir(), "height": Int(1), "width": Int(1),
               "clip_frames": Int(1), "fps": Float(gt=0), "stride": Int(1), "hop": Int(1), "shard_size": Int(1),
               "batch_size": Int(1), "max_clips_per_video": Int(0), "dtype": Choice(DTYPES),
               "camera_format": Choice(("auto",) + camera_files.FORMATS), "split": _Name()}


_REQUIRED = ("videos", "out", "height", "width", "clip_frames")


def check_flags(s):
  """Every flag alone (:data:`FLAG_CHECKS`) and the pairs that exclude each other; one-line :class:`SettingsError`."""
  for arg, check in FLAG_CHECKS.items():
    if s.get(arg) is not None or arg in _REQUIRED:
      try:
        check(f"--{arg}", s[arg])
      except ConfigError as e:
        raise SettingsError(str(e)) from None
  if s.get("fps") is not None and s.get("stride") is not None:
    raise SettingsError(f"--fps={s['fps']!r} and --stride={s['stride']!r}: give one of them")


def check_strides(s, spatial, temporal, vae):
  """Frame sizes against the autoencoder's strides (known from a built-in ``--vae`` name before building it)."""
  for arg in ("height", "width"):
    if s[arg] % spatial:
      raise SettingsError(f"--{arg}={s[arg]!r}: must be a positive multiple of {spatial} (the spatial stride of "
                          f"--vae={vae})")
  if (s["clip_frames"] - 1) % temporal:
    raise SettingsError(f"--clip_frames={s['clip_frames']!r}: must be 1 + k * {temporal} (the causal VAE's first "
                        f"frame alone, then groups of {temporal})")


def check_settings(s):
  """Validates the settings dict (the CLI's arguments and the built encoder); one-line :class:`SettingsError`."""
  check_flags(s)
  enc = s["encoder"]
  check_strides(s, enc.spatial_stride, enc.temporal_stride, enc.name)


def _content_settings(s):
  """The settings that determine record content: a dataset directory holds one combination."""
  return {"format": FORMAT, "record_version": records.RECORD_VERSION, "height": s["height"], "width": s["width"],
          "clip_frames": s["clip_frames"], "fps": s["fps"], "stride": s["stride"], "hop": s["hop"],
          "max_clips_per_video": s["max_clips_per_video"], "vae": s["encoder"].name,
          "temporal_stride": s["encoder"].temporal_stride, "spatial_stride": s["encoder"].spatial_stride,
          "text_encoder": s["text_encoder"].name if s["text_encoder"] else "none", "dtype": s["dtype"]}


class SettingsError(ValueError):
  """Bad settings (a CLI argument): one line naming the argument, its value and what is allowed."""


class _Reject(Exception):
  """A bad input: skipped, its reason logged."""


class _Run:
  """One ingestion run: the clip buffer, shard writing and the manifest."""

  def __init__(self, s):
    self.s, self.out = s, pathlib.Path(s["out"])
    index, count = s["process_index"], s["process_count"]
    self.manifest_path = ingest_parts.manifest_path(self.out, index, count)
    self.rejects_path = ingest_parts.rejects_path(self.out, index, count, REJECTS)
    self.prefix = ingest_parts.shard_prefix(s["split"], index, count)
    settings = _content_settings(s)
    if self.out.is_dir():
      bad = ingest_parts.check_layout(self.out, count)
      if bad:
        raise SettingsError(f"--out={str(self.out)!r}: {bad}")
    self.manifest = json.loads(self.manifest_path.read_text()) if self.manifest_path.is_file() else None
    if self.manifest is not None and self.manifest["settings"] != settings:
      diff = [f"{k}={self.manifest['settings'].get(k)!r} (now {v!r})" for k, v in settings.items()
              if self.manifest["settings"].get(k) != v]
      raise SettingsError(f"--out={str(self.out)!r}: holds clips made with other settings: {', '.join(diff)}; "
                          f"use another --out")
    self.out.mkdir(parents=True, exist_ok=True)
    for tmp in ingest_parts.leftovers(self.out, index, count):  # of a crashed run of this part
      tmp.unlink(missing_ok=True)
    if self.manifest is None or count > 1:  # a part is unfinished until this run ends
      self.manifest = self.manifest or {"settings": settings, "latent_shape": None, "shards": [], "done": {}}
      if count > 1:
        self.manifest["finished"] = False
      write_json(self.manifest_path, self.manifest)
    self.done = self.manifest["done"].setdefault(s["split"], {})
    self.written = {key for sh in self.manifest["shards"] if sh["split"] == s["split"] for key in sh["clips"]}
    self.count = collections.Counter(key.rsplit("/", 1)[0] for key in self.written)  # written clips per stem
    self.rejected = set()
    if self.rejects_path.is_file():
      for line in self.rejects_path.read_text().splitlines():
        r = json.loads(line) if line.strip() else {}
        if r.get("split") == s["split"]:
          self.rejected.add(r.get("video"))
    self.pending, self.buffer, self.totals = [], [], {}
    self.new_clips = self.new_shards = self.new_rejects = 0

  def reject(self, video, reason):
    with open(self.rejects_path, "a") as f:
      f.write(json.dumps({"split": self.s["split"], "video": video.name, "reason": reason}) + "\n")
    self.rejected.add(video.name)
    self.new_rejects += 1

  def add(self, clips, stem):
    self.totals[stem] = len(clips)
    if self.count[stem] == len(clips):  # all written by an earlier run
      self.done[stem] = len(clips)
    for c in clips:
      if c["key"] not in self.written:
        self.pending.append(c)
      if len(self.pending) >= self.s["batch_size"]:
        self.encode()
    self.flush(final=False)

  def encode(self):
    """Encodes the pending clips (one batch) into record bytes."""
    if not self.pending:
      return
    s, enc = self.s, self.s["encoder"]
    lat = np.asarray(enc.fn(np.stack([c["frames"] for c in self.pending])))
    f_lat = 1 + (s["clip_frames"] - 1) // enc.temporal_stride
    if lat.ndim != 5 or lat.shape[:2] != (len(self.pending), f_lat):
      raise ValueError(f"--vae={enc.name}: returned shape {lat.shape}; "
                       f"expected [{len(self.pending)}, {f_lat}, h, w, C]")
    emb = None
    if s["text_encoder"] is not None:
      emb = np.asarray(s["text_encoder"].fn([c["caption"] for c in self.pending])).astype(s["dtype"])
      null_path = self.out / records.NULL_TEXT
      if not null_path.exists():  # the empty prompt's embedding: text dropout and guidance in training
        tmp = self.out / f".{records.NULL_TEXT}.tmp{os.getpid()}"
        with open(tmp, "wb") as fh:
          np.save(fh, np.asarray(s["text_encoder"].fn([""]))[0].astype(s["dtype"]))
        os.replace(tmp, null_path)
    for i, c in enumerate(self.pending):
      c2w, k = latent_cameras(c["c2w"], c["intrinsics"], enc.temporal_stride)
      meta = dict(c["meta"], vae=enc.name, temporal_stride=enc.temporal_stride, latent_shape=list(lat.shape[1:]),
                  text_encoder=s["text_encoder"].name if emb is not None else "none")
      rec = {"latents": lat[i].astype(s["dtype"]), "c2w": c2w, "intrinsics": k.astype(np.float32),
             "first_frame": c["frames"][0], "source_frames": c["source_frames"], "caption": c["caption"],
             "meta": json.dumps(meta)}
      if emb is not None:
        rec["text_emb"] = emb[i]
      self.buffer.append((c["key"], records.encode_record(rec)))
    if self.manifest["latent_shape"] is None:
      self.manifest["latent_shape"] = list(lat.shape[1:])
    self.pending = []

  def flush(self, final):
    """Writes full shards (and with ``final``, the remainder) and updates the manifest."""
    from array_record.python.array_record_module import ArrayRecordWriter  # pylint: disable=g-import-not-at-top
    if final:
      self.encode()
    n = self.s["shard_size"]
    while len(self.buffer) >= n or (final and self.buffer):
      chunk, self.buffer = self.buffer[:n], self.buffer[n:]
      index = sum(sh["split"] == self.s["split"] for sh in self.manifest["shards"])
      name = f"{self.prefix}-{index:05d}.array_record"
      tmp = self.out / f".{name}.tmp{os.getpid()}"
      writer = ArrayRecordWriter(str(tmp), "group_size:1")
      for _, data in chunk:
        writer.write(data)
      writer.close()
      os.replace(tmp, self.out / name)
      keys = [key for key, _ in chunk]
      self.manifest["shards"].append({"file": name, "split": self.s["split"], "num_clips": len(keys), "clips": keys})
      self.written.update(keys)
      self.new_clips += len(keys)
      self.new_shards += 1
      for stem in {key.rsplit("/", 1)[0] for key in keys}:
        self.count[stem] += sum(key.rsplit("/", 1)[0] == stem for key in keys)
        if self.count[stem] == self.totals[stem]:
          self.done[stem] = self.totals[stem]
      write_json(self.manifest_path, self.manifest)

  def finish(self):
    """Multi-process: marks this part finished and merges the manifest when every part is. Returns the
    number of finished parts (1 for one process)."""
    count = self.s["process_count"]
    if count == 1:
      return 1
    self.manifest["finished"] = True
    write_json(self.manifest_path, self.manifest)
    return ingest_parts.merge(self.out, count, REJECTS)


def _prepare(s, video, cameras_dir, captions):
  """The clips of one video (dicts with frames, cameras, caption, meta) or :class:`_Reject`."""
  stem, out_hw = video.stem, (s["height"], s["width"])
  try:
    cam_path = find_camera_file(cameras_dir, stem)
  except ValueError as e:
    raise _Reject(str(e)) from None
  try:
    v = read_video(video, out_hw)
  except ValueError as e:
    raise _Reject(str(e)) from None
  try:
    cams = camera_files.read_cameras(cam_path, v["source_hw"], s["camera_format"])
  except ValueError as e:
    raise _Reject(f"bad camera file: {e}") from None
  n_frames, n_poses = len(v["frames"]), len(cams["c2w"])
  if n_frames != n_poses:
    raise _Reject(f"pose count {n_poses} ({cam_path.name}) does not match frame count {n_frames}")
  try:
    idx = resample_indices(v["timestamps"], s["fps"], s["stride"] if s["fps"] is None else None)
  except ValueError as e:
    raise _Reject(str(e)) from None
  f = s["clip_frames"]
  if len(idx) < f:
    raise _Reject(f"too short: {len(idx)} frames after resampling ({n_frames} decoded), need --clip_frames={f}")
  k = adjust_intrinsics(cams["intrinsics"], v["source_hw"], out_hw)
  starts = list(range(0, len(idx) - f + 1, s["hop"]))
  if s["max_clips_per_video"]:
    starts = starts[:s["max_clips_per_video"]]
  clips = []
  for j, a in enumerate(starts):
    sel = idx[a:a + f]
    meta = {"video": video.name, "stem": stem, "split": s["split"], "clip": j, "start_frame": int(sel[0]),
            "source_fps": v["fps"], "fps": s["fps"] or v["fps"] / (s["stride"] or 1), "stride": s["stride"],
            "image_hw": list(out_hw), "camera_file": cam_path.name}
    clips.append({"key": f"{stem}/{j}", "frames": v["frames"][sel], "c2w": cams["c2w"][sel], "intrinsics": k[sel],
                  "source_frames": sel, "caption": captions.get(stem, ""), "meta": meta})
  return clips


def ingest(videos, out, *, height, width, clip_frames, cameras=None, captions=None, fps=None, stride=None, hop=None,
           split="train", shard_size=64, batch_size=8, encoder=None, text_encoder=None, dtype="float32",
           max_clips_per_video=0, camera_format="auto", require_captions=False, progress=True, process_index=0,
           process_count=1):
  """Ingests a folder of videos (see module doc); arguments as the CLI's flags.

  Args:
    encoder: a :class:`jaxwm.encoders.LatentEncoder` (default :func:`space_to_depth_encoder`).
    text_encoder: a :class:`jaxwm.encoders.CaptionEncoder` or None (captions stored as strings only).
    require_captions: with ``captions``, a video whose stem has none is rejected (else it is ingested with the
      empty caption, and counted and named in the summary).
    process_index, process_count: this process's share of the videos (:mod:`jaxwm.data.ingest_parts`): every
      ``process_count``-th video from the ``process_index``-th, its own shards and part manifest; the last
      process to finish writes ``manifest.json``.

  Returns:
    dict with ``new_clips``, ``new_shards``, ``rejected`` (new), ``skipped`` (done or rejected
    earlier), ``total_clips`` (of ``split``), ``uncaptioned`` (stems of this call's videos ingested without a
    caption although ``captions`` was given) and ``summary`` (one line).

  Raises:
    SettingsError: one line, for bad settings (nothing is written then).
  """
  s = dict(videos=videos, out=out, height=height, width=width, clip_frames=clip_frames, cameras=cameras,
           captions=captions, fps=fps, stride=stride, hop=hop, split=split, shard_size=shard_size,
           batch_size=batch_size, encoder=encoder or space_to_depth_encoder(), text_encoder=text_encoder,
           dtype=dtype, max_clips_per_video=max_clips_per_video, camera_format=camera_format,
           process_index=process_index, process_count=process_count)
  check_settings(s)
  if not 0 <= process_index < process_count:
    raise SettingsError(f"--process_index={process_index!r}: must be in [0, --process_count={process_count})")
  if require_captions and captions is None:
    raise SettingsError("--require_captions: needs --captions (the file or folder the captions are in)")
  if s["fps"] is None and s["stride"] is None:
    s["stride"] = 1
  s["hop"] = s["hop"] or clip_frames
  cameras_dir = pathlib.Path(cameras if cameras is not None else videos)
  caps = load_captions(captions, cameras_dir)
  vids = sorted(p for p in pathlib.Path(videos).iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES)
  if not vids:
    raise SettingsError(f"--videos={str(videos)!r}: no videos ({' '.join(VIDEO_SUFFIXES)})")
  first = {}
  for g, v in enumerate(vids):
    first.setdefault(v.stem, g)
  duplicate = {v.name for g, v in enumerate(vids) if first[v.stem] != g}  # a later video with an earlier one's stem
  n_all, vids = len(vids), vids[process_index::process_count]  # this process's share
  run = _Run(s)
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  skipped, uncaptioned = 0, []
  bar = tqdm(vids, desc="ingest", unit="video", disable=not progress, file=sys.stderr)
  for video in bar:
    if video.stem in run.done or video.name in run.rejected:
      skipped += 1
      continue
    try:
      if video.name in duplicate:
        raise _Reject(f"duplicate stem {video.stem!r} (another video has it)")
      missing = captions is not None and video.stem not in caps
      if missing and require_captions:
        raise _Reject(f"no caption for {video.stem!r} in --captions={str(captions)!r} (--require_captions)")
      run.add(_prepare(s, video, cameras_dir, caps), video.stem)
      if missing:
        uncaptioned.append(video.stem)
    except _Reject as e:
      run.reject(video, " ".join(str(e).split()))
    bar.set_postfix(clips=run.new_clips + len(run.buffer) + len(run.pending), rejected=run.new_rejects)
  run.flush(final=True)
  finished = run.finish()
  total = sum(sh["num_clips"] for sh in run.manifest["shards"] if sh["split"] == split)
  n_shards = sum(sh["split"] == split for sh in run.manifest["shards"])
  who = "" if process_count == 1 else f" (process {process_index} of {process_count}: {len(vids)} of {n_all})"
  summary = (f"ingest{who}: {len(vids)} videos: {run.new_clips} new clips in {run.new_shards} new shards, "
             f"{run.new_rejects} rejected" + (f" (reasons in {run.rejects_path})" if run.new_rejects else "") +
             f", {skipped} done or rejected before; ")
  if process_count == 1:
    summary += f"{run.out} holds {total} {split} clips in {n_shards} shards"
  elif finished == process_count:
    merged = records.read_manifest(run.out)
    total = sum(sh["num_clips"] for sh in merged["shards"] if sh["split"] == split)
    summary += (f"every part is finished: {run.out}/{records.MANIFEST} merged, {total} {split} clips in "
                f"{sum(sh['split'] == split for sh in merged['shards'])} shards")
  else:
    summary += (f"this part holds {total} {split} clips; {finished} of {process_count} parts finished (the last "
                f"process to finish writes {records.MANIFEST})")
  if uncaptioned:
    names = ", ".join(uncaptioned[:5]) + (f", ... ({len(uncaptioned) - 5} more)" if len(uncaptioned) > 5 else "")
    summary += (f"; {len(uncaptioned)} video(s) had no caption in {captions} and were ingested with the empty "
                f"caption: {names} (--require_captions rejects them)")
  return {"new_clips": run.new_clips, "new_shards": run.new_shards, "rejected": run.new_rejects, "skipped": skipped,
          "total_clips": total, "uncaptioned": uncaptioned, "summary": summary}


def _parser():
  p = Parser(prog="python -m jaxwm.data.ingest", description=__doc__.split("\n\n")[0])
  c = FLAG_CHECKS
  p.add_argument("--videos", required=True, check=c["videos"], help="directory of videos")
  p.add_argument("--out", required=True, check=c["out"], help="dataset directory (shards, manifest.json, rejects.jsonl)")
  p.add_argument("--cameras", check=c["cameras"], help="directory of camera files (default: --videos)")
  p.add_argument("--camera_format", default="auto", check=c["camera_format"],
                 help=f"auto or one of {camera_files.FORMATS}")
  p.add_argument("--captions", help="JSON / JSONL {stem: caption} file, or a directory of <stem>.txt")
  p.add_argument("--require_captions", action="store_true",
                 help="reject a video with no caption in --captions (default: the empty caption, named in the summary)")
  p.add_argument("--height", type=int, required=True, check=c["height"])
  p.add_argument("--width", type=int, required=True, check=c["width"])
  p.add_argument("--fps", type=float, check=c["fps"], help="resample to this frame rate (nearest frames)")
  p.add_argument("--stride", type=int, check=c["stride"], help="keep every stride-th frame (default 1 when no --fps)")
  p.add_argument("--clip_frames", type=int, required=True, check=c["clip_frames"], help="pixel frames per clip")
  p.add_argument("--hop", type=int, check=c["hop"], help="frames between clip starts (default: --clip_frames)")
  p.add_argument("--max_clips_per_video", type=int, default=0, check=c["max_clips_per_video"], help="0: all")
  p.add_argument("--split", default="train", check=c["split"], help="split name (shard file prefix)")
  p.add_argument("--shard_size", type=int, default=64, check=c["shard_size"], help="clips per shard file")
  p.add_argument("--batch_size", type=int, default=8, check=c["batch_size"], help="clips per encoder call")
  p.add_argument("--vae", default="space_to_depth",
                 help="space_to_depth[:S], wan2.2:<weights>, wan2.1:<weights>, wan2.2-tiny:<seed>, "
                      "wan2.1-tiny:<seed>, or a plug-in module:factory / file.py:factory")
  p.add_argument("--text_encoder", default="none",
                 help="none, umt5:<tokenizer>,<weights>, umt5-tiny:<seed>, or a plug-in module:factory / "
                      "file.py:factory")
  p.add_argument("--dtype", default="float32", check=c["dtype"], help=f"latent and text storage, one of {DTYPES}")
  p.add_argument("--process_index", type=int, default=None, check=Int(0),
                 help="this process's index among --process_count processes ingesting the same --videos into the "
                      "same --out (a shared file system); default 0, or jax.process_index() with --distributed")
  p.add_argument("--process_count", type=int, default=None, check=Int(1), help="processes in the job (default 1)")
  p.add_argument("--distributed", action="store_true",
                 help="join jax.distributed (TPU pods and SLURM are detected; else JAX_COORDINATOR_ADDRESS, "
                      "JAX_NUM_PROCESSES, JAX_PROCESS_ID) and take the index and count from it")
  p.add_argument("--no_progress", action="store_true")
  return p


def _process_share(kw):
  """Sets ``process_index`` / ``process_count`` from the flags or, with ``--distributed``, from jax.distributed."""
  distributed = kw.pop("distributed")
  if distributed:
    if kw["process_index"] is not None or kw["process_count"] is not None:
      raise SettingsError("--distributed takes the process index and count from jax.distributed: drop "
                          "--process_index/--process_count")
    import jax  # pylint: disable=g-import-not-at-top
    if not jax.distributed.is_initialized():
      env = {"num_processes": int(os.environ["JAX_NUM_PROCESSES"]), "process_id": int(os.environ["JAX_PROCESS_ID"])} \
          if "JAX_NUM_PROCESSES" in os.environ and "JAX_PROCESS_ID" in os.environ else {}
      jax.distributed.initialize(**env)
    kw["process_index"], kw["process_count"] = jax.process_index(), jax.process_count()
  kw["process_count"] = kw["process_count"] or 1
  kw["process_index"] = kw["process_index"] or 0
  if kw["process_index"] >= kw["process_count"]:
    raise SettingsError(f"--process_index={kw['process_index']!r}: must be in [0, --process_count="
                        f"{kw['process_count']})")


def main(argv=None):
  args = _parser().parse_args(argv)  # each flag checked
  try:
    kw = vars(args).copy()
    check_flags(kw)
    try:
      strides = autoencoder_strides(kw["vae"])
    except ValueError as e:
      raise SettingsError(f"--vae={kw['vae']!r}: {' '.join(str(e).split())}") from None
    if strides is not None:  # a built-in VAE: sizes refused before its weights are read
      check_strides(kw, *strides, kw["vae"])
    if kw["require_captions"] and kw["captions"] is None:  # before any encoder is built
      raise SettingsError("--require_captions: needs --captions (the file or folder the captions are in)")
    _process_share(kw)
    if pathlib.Path(kw["out"]).is_dir():  # before any encoder is built
      bad = ingest_parts.check_layout(kw["out"], kw["process_count"])
      if bad:
        raise SettingsError(f"--out={kw['out']!r}: {bad}")
    progress = not kw.pop("no_progress")
    kw["encoder"] = make_encoder(kw.pop("vae"))
    kw["text_encoder"] = make_text_encoder(kw.pop("text_encoder"))
    result = ingest(progress=progress, **kw)
  except SettingsError as e:
    raise Refusal(e) from None
  print(result["summary"])
  return 0


if __name__ == "__main__":
  sys.exit(run_cli(main, sys.argv[1:], "jaxwm.data.ingest"))
