"""Camera files on disk: one reader and one writer per format, and the ``read_cameras`` dispatcher.

Formats (``fmt``), all read as OpenCV camera-to-world ``c2w [F, 4, 4]`` float64 with
translations in metres and intrinsics ``[F, 3, 3]`` float64 in pixels of ``image_hw``:

- ``realestate10k``: ``.txt`` (:func:`jaxwm.geometry.formats.parse_realestate10k`).
- ``c2w_json``: ``.json`` with ``convention``, ``unit`` and ``frames[].c2w``
  (:func:`jaxwm.geometry.formats.parse_c2w_json` documents the schema).
- ``nerfstudio``: ``transforms.json`` with ``frames[].transform_matrix``
  (:func:`jaxwm.geometry.formats.parse_nerfstudio_transforms`).
- ``npy``: ``<name>.npy`` holding ``c2w [F, 4, 4]`` (OpenCV, metres) and a sibling
  ``<name>.K.npy`` holding ``K`` ``[3, 3]`` or ``[F, 3, 3]`` in pixels of ``image_hw``.
- ``npz``: ``<name>.npz`` with keys ``c2w`` and ``K`` as above, and optionally ``image_hw``
  (``[H, W]`` the pixel ``K`` refers to; rescaled to the requested ``image_hw``).

Errors are one-line ``ValueError``\\ s that start with the file's path.
"""

import pathlib

import numpy as np

from jaxwm.geometry import formats
from jaxwm.geometry.validate import validate_cameras

FORMATS = ("realestate10k", "c2w_json", "nerfstudio", "npy", "npz")
SUFFIXES = (".txt", ".json", ".npy", ".npz")  # what camera files end in
K_SUFFIX = ".K.npy"  # the intrinsics sibling of a ``.npy`` camera file


def k_path(path):
  """``<dir>/<name>.K.npy``, the intrinsics of the ``.npy`` camera file ``<dir>/<name>.npy``."""
  p = pathlib.Path(path)
  return p.with_name(p.name[:-len(".npy")] + K_SUFFIX)


def detect_format(path):
  """The format of ``path`` from its suffix, and for ``.json`` from its keys (see module doc)."""
  p = pathlib.Path(path)
  suffix = p.suffix.lower()
  if suffix == ".txt":
    return "realestate10k"
  if suffix in (".npy", ".npz"):
    return suffix[1:]
  if suffix == ".json":
    meta = formats._loads(p.read_text(), "camera file")  # pylint: disable=protected-access
    frames = meta.get("frames") if isinstance(meta, dict) else None
    first = frames[0] if isinstance(frames, list) and frames and isinstance(frames[0], dict) else {}
    if "transform_matrix" in first:
      return "nerfstudio"
    if "c2w" in first or "convention" in meta:
      return "c2w_json"
    raise ValueError("JSON is neither a c2w JSON (frames[].c2w) nor a transforms.json (frames[].transform_matrix)")
  raise ValueError(f"unknown camera file suffix {suffix!r}; expected one of {SUFFIXES}")


def _load_npy(path):
  try:
    return np.load(path, allow_pickle=False)
  except FileNotFoundError:
    raise ValueError(f"missing {pathlib.Path(path).name}") from None
  except Exception as e:  # pylint: disable=broad-except  # pickles, bad zips, truncated headers
    raise ValueError(f"{pathlib.Path(path).name} is not a numpy file ({type(e).__name__}: {e})") from None


def _arrays(c2w, k, image_hw, k_hw=None):
  c2w, k = np.asarray(c2w, np.float64), np.asarray(k, np.float64)
  if c2w.ndim != 3 or c2w.shape[1:] != (4, 4):
    raise ValueError(f"c2w must have shape [F, 4, 4]; got {c2w.shape}")
  if k.shape == (3, 3):
    k = np.broadcast_to(k, (len(c2w), 3, 3))
  if k.shape != (len(c2w), 3, 3):
    raise ValueError(f"K must have shape [3, 3] or [F, 3, 3] with F = {len(c2w)}; got {k.shape}")
  if k_hw is not None:
    k = formats.scale_intrinsics(k, tuple(np.asarray(k_hw).tolist()), image_hw)
  c2w, k = c2w.copy(), np.array(k)
  validate_cameras(c2w, k)
  return {"c2w": c2w, "intrinsics": k}


def _read(path, image_hw, fmt):
  if fmt == "realestate10k":
    return formats.parse_realestate10k(path.read_text(), image_hw)
  if fmt == "c2w_json":
    return formats.parse_c2w_json(path.read_text(), image_hw)
  if fmt == "nerfstudio":
    return formats.parse_nerfstudio_transforms(path.read_text(), image_hw)
  if fmt == "npy":
    return _arrays(_load_npy(path), _load_npy(k_path(path)), image_hw)
  if fmt == "npz":
    z = _load_npy(path)
    if not hasattr(z, "files") or "c2w" not in z.files or "K" not in z.files:
      raise ValueError(f"npz needs keys 'c2w' and 'K'; has {sorted(getattr(z, 'files', []))}")
    with z:
      return _arrays(z["c2w"], z["K"], image_hw, z["image_hw"] if "image_hw" in z.files else None)
  raise ValueError(f"fmt must be 'auto' or one of {FORMATS}; got {fmt!r}")


def read_cameras(path, image_hw, fmt="auto"):
  """Reads a camera file of any supported format.

  Args:
    path: the camera file.
    image_hw: ``(H, W)`` of the frames the intrinsics will be used at.
    fmt: ``"auto"`` (by suffix, and content for ``.json``) or one of :data:`FORMATS`.

  Returns:
    dict with ``c2w [F, 4, 4]`` (float64, OpenCV camera-to-world, metres), ``intrinsics
    [F, 3, 3]`` (float64, pixels of ``image_hw``) and, for RealEstate10K, ``timestamps [F]``.

  Raises:
    ValueError: one line, starting with the path, naming the problem.
  """
  path = pathlib.Path(path)
  image_hw = (int(image_hw[0]), int(image_hw[1]))
  try:
    if not path.is_file():
      raise ValueError("no such file")
    return _read(path, image_hw, detect_format(path) if fmt == "auto" else fmt)
  except (ValueError, OSError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: {' '.join(str(e).split())}") from None


def write_cameras(path, c2w, intrinsics, image_hw, fmt="auto", *, convention="opencv", unit="m"):
  """Writes OpenCV metric cameras (``c2w [F, 4, 4]``, ``intrinsics [F, 3, 3]`` in pixels of
  ``image_hw``) in ``fmt`` (``"auto"``: ``.txt`` RealEstate10K, ``.json`` c2w JSON, ``.npy``,
  ``.npz``; name ``nerfstudio`` explicitly). ``convention`` and ``unit`` apply to c2w JSON.
  Returns the path; ``.npy`` also writes ``<name>.K.npy``; ``.npz`` records ``image_hw``."""
  path = pathlib.Path(path)
  if fmt == "auto":
    fmt = {".txt": "realestate10k", ".json": "c2w_json", ".npy": "npy", ".npz": "npz"}.get(path.suffix.lower())
    if fmt is None:
      raise ValueError(f"{path}: unknown camera file suffix {path.suffix!r}; expected one of {SUFFIXES}")
  c2w, k = np.asarray(c2w, np.float64), np.asarray(intrinsics, np.float64)
  validate_cameras(c2w, k)
  if fmt == "realestate10k":
    path.write_text(formats.format_realestate10k(c2w, k, image_hw))
  elif fmt == "c2w_json":
    path.write_text(formats.format_c2w_json(c2w, k, image_hw, convention, unit))
  elif fmt == "nerfstudio":
    path.write_text(formats.format_nerfstudio_transforms(c2w, k, image_hw))
  elif fmt == "npy":
    if path.suffix.lower() != ".npy":
      raise ValueError(f"{path}: an npy camera file must end in .npy")
    np.save(path, c2w)
    np.save(k_path(path), k)
  elif fmt == "npz":
    with open(path, "wb") as f:
      np.savez(f, c2w=c2w, K=k, image_hw=np.asarray(image_hw, np.int64))
  else:
    raise ValueError(f"fmt must be 'auto' or one of {FORMATS}; got {fmt!r}")
  return path
