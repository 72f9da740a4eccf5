"""Array-namespace dispatch: numpy in, numpy out (float64 stays float64); jax in, jax out.

The geometry functions serve both the data pipeline (numpy, in grain workers, no device)
and the models (jax, under jit). They use only the operations numpy and jax.numpy share.
"""

import numpy as np


def xp_of(*arrays):
  """Returns ``numpy`` if every argument is a numpy array or Python scalar, else ``jax.numpy``."""
  for a in arrays:
    if a is None or isinstance(a, (np.ndarray, np.generic, int, float, bool, list, tuple)):
      continue
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    return jnp
  return np


def asarray(xp, x):
  """``xp.asarray`` that keeps floating dtypes and turns Python/integer data into float32."""
  x = xp.asarray(x)
  if not xp.issubdtype(x.dtype, xp.floating):
    x = x.astype(xp.float32)
  return x
