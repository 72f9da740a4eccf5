"""LPIPS (Zhang et al. 2018, AlexNet variant, v0.1) in JAX, with a converter from the public weights.

Distance of two images: each is scaled (``(x - shift) / scale``, x in ``[-1, 1]``), passed
through AlexNet's five conv+ReLU stages; at every stage the features are normalised over
channels (``f / (|f| + 1e-10)``), the squared difference is weighted per channel by the
stage's linear layer (a 1x1 convolution to one channel, no bias), averaged over space; the
five numbers are summed.

Weights are not downloadable here: convert the public files once, then load the ``.npz``::

  python -m jaxwm.evaluation.lpips --alexnet alexnet-owt-7be5be79.pth --lin alex.pth --out lpips_alex.npz

(``alexnet-owt-*.pth`` is torchvision's AlexNet; ``alex.pth`` is ``lpips/weights/v0.1/alex.pth``
from the LPIPS repository; converting needs ``torch``.)
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

SHIFT = np.array([-0.030, -0.088, -0.188], np.float32)
SCALE = np.array([0.458, 0.448, 0.450], np.float32)
# torchvision AlexNet feature indices of the five convolutions: (name, stride, padding, max-pool before it)
CONVS = (("features.0", 4, 2, False), ("features.3", 1, 2, True), ("features.6", 1, 1, True),
         ("features.8", 1, 1, False), ("features.10", 1, 1, False))
CHANNELS = (64, 192, 384, 256, 256)


def param_names():
  """Every array a weight file must hold (torch names and layouts: OIHW kernels)."""
  names = []
  for name, *_ in CONVS:
    names += [f"{name}.weight", f"{name}.bias"]
  return names + [f"lin{i}.model.1.weight" for i in range(5)]


def convert(alexnet_state, lin_state):
  """Two torch state dicts (as name -> array) -> one flat ``{name: float32 array}``; every
  parameter of :func:`param_names` must be present, and nothing else is kept."""
  merged = {**{k: v for k, v in alexnet_state.items() if k.startswith("features.")}, **lin_state}
  missing = [n for n in param_names() if n not in merged]
  if missing:
    raise ValueError(f"LPIPS weights are missing {missing}")
  return {n: np.asarray(merged[n], np.float32) for n in param_names()}


def load_params(path):
  """``{name: jnp array}`` from an ``.npz`` written by :func:`convert` (see the module docstring)."""
  with np.load(path) as z:
    missing = [n for n in param_names() if n not in z.files]
    if missing:
      raise ValueError(f"{path} is not an LPIPS weight file: missing {missing}")
    return {n: jnp.asarray(z[n]) for n in param_names()}


def _conv(x, w, b, stride, pad):
  y = jax.lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad), (pad, pad)],
                                   dimension_numbers=("NCHW", "OIHW", "NCHW"), precision="highest")
  return y + b[None, :, None, None]


def _maxpool(x):
  return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 3, 3), (1, 1, 2, 2), "VALID")


def features(params, x):
  """AlexNet ReLU outputs of the five stages for ``x [N, 3, H, W]`` in ``[-1, 1]``."""
  x = (x - SHIFT[None, :, None, None]) / SCALE[None, :, None, None]
  outs = []
  for name, stride, pad, pool in CONVS:
    if pool:
      x = _maxpool(x)
    x = jax.nn.relu(_conv(x, params[f"{name}.weight"], params[f"{name}.bias"], stride, pad))
    outs.append(x)
  return outs


def lpips(params, a, b):
  """LPIPS distance per image.

  Args:
    params: from :func:`load_params`.
    a, b: images ``[..., H, W, 3]``, uint8 (0..255) or float in ``[-1, 1]``.

  Returns:
    ``[...]`` float32.
  """
  def prep(x):
    x = jnp.asarray(x)
    x = x.astype(jnp.float32) / 127.5 - 1.0 if x.dtype == jnp.uint8 else x.astype(jnp.float32)
    return jnp.moveaxis(x.reshape((-1,) + x.shape[-3:]), -1, 1)

  lead = jnp.shape(a)[:-3]
  total = 0.0
  for i, (fa, fb) in enumerate(zip(features(params, prep(a)), features(params, prep(b)))):
    na = fa / (jnp.sqrt(jnp.sum(fa * fa, axis=1, keepdims=True)) + 1e-10)
    nb = fb / (jnp.sqrt(jnp.sum(fb * fb, axis=1, keepdims=True)) + 1e-10)
    w = params[f"lin{i}.model.1.weight"][0, :, 0, 0]
    total = total + jnp.mean(jnp.einsum("nchw,c->nhw", (na - nb) ** 2, w), axis=(1, 2))
  return total.reshape(lead)


def main():
  p = argparse.ArgumentParser(description="convert public LPIPS (AlexNet) weights to an .npz for jaxwm")
  p.add_argument("--alexnet", required=True, help="torchvision AlexNet state dict (.pth)")
  p.add_argument("--lin", required=True, help="LPIPS v0.1 linear layers (alex.pth)")
  p.add_argument("--out", required=True)
  a = p.parse_args()
  import torch  # pylint: disable=g-import-not-at-top
  load = lambda path: {k: v.detach().cpu().numpy() for k, v in torch.load(path, map_location="cpu").items()}
  np.savez(a.out, **convert(load(a.alexnet), load(a.lin)))
  print(f"wrote {a.out}")


if __name__ == "__main__":
  main()
