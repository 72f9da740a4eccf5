"""Sampling with a distilled adapter: ``sample.py --adapter <path>`` and the loop-closure benchmark's
``--adapter``. The adapter is merged into the base once (:func:`jaxwm.lora.merge`: ``W' = W + (alpha/r) A B``,
no per-step cost), and its few-step sampling settings (saved in its ``extra`` by :mod:`jaxwm.distill.loop`)
become the defaults of ``config.sample``, so the unchanged streaming sampler runs what was distilled.
"""

import pathlib

from jaxwm import lora
from jaxwm.lora import adapters
from jaxwm.utils.cli import refuse


def adapter_path(path):
  """A distillation workdir (with ``adapter/``), an adapter directory, or one step's directory -> the path
  :func:`jaxwm.lora.adapters.load_adapter` reads."""
  p = pathlib.Path(path).expanduser()
  return p / "adapter" if (p / "adapter").is_dir() else p


def adapter_tag(path):
  """A short name for output files: the distillation workdir's name (``runs/tiny_distill/adapter/600`` ->
  ``tiny_distill``)."""
  p = pathlib.Path(path).expanduser().absolute()
  if p.name.isdigit():
    p = p.parent
  if p.name == "adapter":
    p = p.parent
  return p.name or "adapter"


def apply_adapter(config, variables, path):
  """Merges the adapter at ``path`` into ``variables`` and sets ``config.sample.num_steps`` / ``shift`` /
  ``guidance`` / ``noise_scale`` to the adapter's (when it records them: a distilled adapter samples at guidance 1).

  Args:
    config: the base checkpoint's ``ConfigDict`` (``sample`` is updated in place).
    variables: ``{"params": ...}`` of the base model (as :func:`jaxwm.sampling.load.load_model` returns).
    path: see :func:`adapter_path`.

  Returns:
    ``(variables, note)``: the merged ``{"params": ...}`` and a one-line description. Raises
    ``FileNotFoundError`` (no adapter) or :class:`jaxwm.lora.AdapterMismatchError` (another model's adapter),
    both ``ValueError``/``OSError`` subclasses whose message is one line.
  """
  path = adapter_path(path)
  params = variables["params"]
  adapter, spec = adapters.load_adapter(path, params)
  meta = adapters.adapter_metadata(path)
  extra = meta.get("extra") or {}
  if "num_steps" in extra:
    config.sample.num_steps = int(extra["num_steps"])
  if "shift" in extra:
    config.sample.shift = float(extra["shift"])
  if "guidance" in extra and "guidance" in config.sample:  # a distilled student folds the teacher's guidance in
    config.sample.guidance = float(extra["guidance"])
  if "noise_scale" in extra:  # the scale of the noise it was trained from
    with config.sample.unlocked():
      config.sample.noise_scale = float(extra["noise_scale"])
  scale = f", noise scale {float(extra['noise_scale']):g}" if extra.get("noise_scale", 1.0) != 1.0 else ""
  note = (f"adapter {path}: rank {spec.rank}, {meta.get('param_count', 0) / 1e6:.3f}M values, merged; "
          f"{config.sample.num_steps} steps, shift {config.sample.shift:g}{scale}")
  return {**variables, "params": lora.merge(params, adapter, spec)}, note


def adapter_flag(config, variables, path, tool):
  """``--adapter PATH`` of a sampling tool (``sample.py``, loop closure): :func:`apply_adapter`, its note printed
  as ``<tool>: <note>``; returns ``(variables, tag)``, ``tag`` (``_<adapter_tag>``) for output names. A missing
  or mismatched adapter is a :class:`jaxwm.utils.cli.Refusal` naming the flag."""
  try:
    variables, note = apply_adapter(config, variables, path)
  except (FileNotFoundError, ValueError) as e:
    raise refuse("--adapter", path, e) from None
  print(f"{tool}: {note}")
  return variables, f"_{adapter_tag(path)}"
