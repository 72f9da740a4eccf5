"""Image metrics (docs/design.md §10): PSNR and SSIM, computed by dm-pix.

SSIM is Wang et al. (2004): 11x11 Gaussian window (sigma 1.5), k1 = 0.01, k2 = 0.03, 'valid'
windows, the mean over windows and colour channels (each channel treated as a grey image).
Inputs (uint8 or float, in ``[0, data_range]``) are scaled to ``[0, 1]`` in float32 for dm-pix;
values agree with a float64 reference to about 1e-6.
"""

import dm_pix as pix
import jax
import jax.numpy as jnp
import numpy as np

_psnr = jax.jit(pix.psnr)
_ssim = jax.jit(pix.ssim, static_argnames=("filter_size",))


def _apply(fn, a, b, data_range):
  """Runs ``fn`` on ``[N, H, W, C]`` float32 in ``[0, 1]``; ``a, b [..., H, W, C]`` (broadcast) -> ``[...]``."""
  a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
  lead, hwc = a.shape[:-3], a.shape[-3:]
  x, y = (jnp.asarray(v.reshape((-1,) + hwc), jnp.float32) / data_range for v in (a, b))
  return np.asarray(fn(x, y), np.float64).reshape(lead)[()]


def psnr(a, b, data_range=255.0):
  """PSNR in dB over the last three axes: ``a, b [..., H, W, C]`` -> ``[...]``.

  Identical images give ``inf`` (zero MSE), e.g. frame 0 when it is the given context frame;
  callers writing JSON must handle it.
  """
  return _apply(_psnr, a, b, data_range)


def ssim(a, b, data_range=255.0, size=11, sigma=1.5, k1=0.01, k2=0.03):
  """Mean SSIM (Wang et al. 2004): ``a, b [..., H, W, C]`` -> ``[...]``; ``H, W >= size``."""
  return _apply(lambda x, y: _ssim(x, y, max_val=1.0, filter_size=size, filter_sigma=sigma, k1=k1, k2=k2),
                a, b, data_range)
