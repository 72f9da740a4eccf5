"""Reading PyTorch weight files without loading them whole: safetensors (any dtype, ``BF16`` included, which
``safetensors.numpy`` cannot read) and ``torch.save`` state dicts (``.pth``/``.pt``/``.bin``, the release's
``Wan2.2_VAE.pth`` and ``models_t5_umt5-xxl-enc-bf16.pth``), both memory-mapped and read tensor by tensor.

``open_weights(path).get(key)`` gives a numpy array in the file's dtype (bfloat16 as ``ml_dtypes.bfloat16``);
:func:`read_state_dict` reads files or folders of ``*.safetensors`` into one dict. Every unreadable or truncated
file is refused with a ``ValueError`` naming the file and what was expected.
"""

import json
import os
import pathlib

import numpy as np

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
TORCH_SUFFIXES = (".pth", ".pt", ".bin")


class SafetensorsFile:
  """A safetensors file: ``header`` (key -> dtype, shape, offsets) read at once, tensors memory-mapped."""

  def __init__(self, path):
    self.path = str(path)
    size = os.path.getsize(self.path)
    with open(self.path, "rb") as f:
      n = int.from_bytes(f.read(8), "little")
      if not 2 <= n <= size - 8:
        raise ValueError(f"{self.path}: not a safetensors file (header length {n} for a file of {size} bytes)")
      try:
        header = json.loads(f.read(n))
      except ValueError:
        raise ValueError(f"{self.path}: not a safetensors file (its header is not JSON)") from None
    header.pop("__metadata__", None)
    self.header, self.start = header, 8 + n
    end = max((v["data_offsets"][1] for v in header.values()), default=0)
    if self.start + end > size:
      raise ValueError(f"{self.path}: truncated ({size} bytes; its header describes {self.start + end})")
    self._mm = None

  def get(self, key):
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    info = self.header[key]
    dtype = ml_dtypes.bfloat16 if info["dtype"] == "BF16" else _ST_DTYPES.get(info["dtype"])
    if dtype is None:
      raise ValueError(f"{self.path}: tensor {key!r} has dtype {info['dtype']}; expected one of BF16, "
                       f"{', '.join(_ST_DTYPES)}")
    if self._mm is None:
      self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
    lo, hi = info["data_offsets"]
    return self._mm[self.start + lo:self.start + hi].view(dtype).reshape(info["shape"])


def to_numpy(t):
  """A torch tensor (or array-like) -> numpy, bfloat16 as ``ml_dtypes.bfloat16`` (numpy has no bfloat16)."""
  if not hasattr(t, "detach"):
    return np.asarray(t)
  import torch  # pylint: disable=g-import-not-at-top
  t = t.detach().cpu()
  if t.dtype == torch.bfloat16:
    import ml_dtypes  # pylint: disable=g-import-not-at-top
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return t.numpy()


class TorchFile:
  """A ``torch.save`` state dict, memory-mapped (``torch.load(mmap=True, weights_only=True)``); needs torch."""

  def __init__(self, path):
    self.path = str(path)
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError:
      raise ValueError(f"{self.path}: reading a .pth state dict needs torch (pip install torch)") from None
    try:
      self._sd = torch.load(self.path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # pylint: disable=broad-except  (torch raises several kinds for a bad file)
      raise ValueError(f"{self.path}: not a torch state dict ({type(e).__name__}: {' '.join(str(e).split())[:200]})") \
          from None
    if isinstance(self._sd, dict) and isinstance(self._sd.get("state_dict"), dict):
      self._sd = self._sd["state_dict"]  # a training checkpoint's wrapper
    if not isinstance(self._sd, dict):
      raise ValueError(f"{self.path}: holds a {type(self._sd).__name__}, not a state dict of tensors")
    self.header = {k: None for k in self._sd}

  def get(self, key):
    return to_numpy(self._sd[key])


def open_weights(path):
  """:class:`TorchFile` for ``.pth``/``.pt``/``.bin``, else :class:`SafetensorsFile`."""
  if not pathlib.Path(path).is_file():
    raise ValueError(f"{path}: no such weights file")
  return TorchFile(path) if str(path).endswith(TORCH_SUFFIXES) else SafetensorsFile(path)


def weight_files(paths):
  """The files of ``paths`` (a path or a list): a folder stands for its ``*.safetensors`` files (sorted; a
  folder without any falls back to its ``.pth``/``.pt``/``.bin`` files)."""
  paths = [paths] if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__") else list(paths)
  files = []
  for p in map(pathlib.Path, paths):
    if p.is_dir():
      found = sorted(p.glob("*.safetensors")) or sorted(q for s in TORCH_SUFFIXES for q in p.glob(f"*{s}"))
      if not found:
        raise ValueError(f"{p}: a folder without .safetensors (or .pth) weight files")
      files += found
    else:
      files.append(p)
  if not files:
    raise ValueError("no weights file given (an empty list)")
  return files


def read_state_dict(paths):
  """All tensors of the weight files (:func:`weight_files`) as ``{key: numpy array}`` in the files' dtypes."""
  sd = {}
  for p in weight_files(paths):
    f = open_weights(p)
    for k in f.header:
      sd[k] = f.get(k)
  return sd
