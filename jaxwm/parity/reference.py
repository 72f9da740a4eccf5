"""What the three parity checks share on the PyTorch side: building the reference in float32 from (possibly
bfloat16-rounded) weights, and its bfloat16 twin."""

import copy

import numpy as np


def round_weights(sd, dtype):
  """The state dict as the ``dtype`` run sees it: bfloat16 rounds every weight once, for both sides."""
  if dtype != "bfloat16":
    return sd
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  return {k: np.asarray(v).astype(ml_dtypes.bfloat16) for k, v in sd.items()}


def load_reference(module, sd, path, allow_missing=()):
  """``module`` (a fresh PyTorch model, float32) with ``sd`` loaded; a one-line ``ValueError`` naming ``path``
  when keys are missing or left over."""
  import torch  # pylint: disable=g-import-not-at-top
  result = module.load_state_dict({k: torch.from_numpy(np.array(v, np.float32)) for k, v in sd.items()}, strict=False)
  missing = [k for k in result.missing_keys if k not in allow_missing]
  if missing or result.unexpected_keys:
    raise ValueError(f"{path}: the weights do not fit the config's model: missing {missing[:3]}, unexpected "
                     f"{result.unexpected_keys[:3]}")
  return module.float().eval()


def bfloat16_twin(module):
  """A bfloat16 copy of the float32 reference, keeping in float32 the modules the model class asks to keep
  (``_keep_in_fp32_modules``), as ``from_pretrained(torch_dtype=torch.bfloat16)`` does."""
  import torch  # pylint: disable=g-import-not-at-top
  twin = copy.deepcopy(module).to(torch.bfloat16)
  keep = set(getattr(module, "_keep_in_fp32_modules", None) or ())
  for name, sub in twin.named_modules():
    if keep & set(name.split(".")):
      sub.float()
  return twin.eval()


def quiet():
  """Silences diffusers' and transformers' warnings about casting (the twin is cast on purpose)."""
  try:
    import diffusers  # pylint: disable=g-import-not-at-top
    diffusers.utils.logging.set_verbosity_error()
  except ImportError:
    pass
  try:
    import transformers  # pylint: disable=g-import-not-at-top
    transformers.utils.logging.set_verbosity_error()
  except ImportError:
    pass
