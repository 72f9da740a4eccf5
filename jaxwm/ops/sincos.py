"""``sin x`` and ``cos x`` together, as one elementwise polynomial that XLA fuses and vectorises.

XLA:CPU lowers ``jnp.sin`` / ``jnp.cos`` to about 9 ns per element on this project's 2-core CPU (an exponential
costs 0.6 ns); WorldRoPE evaluates one sine and one cosine per key, query view, depth hypothesis and channel pair,
so they dominated its expected rotary factor. Here, with ``n = round(2 x / pi)``:

    r = x - n pi/2                          (Cody-Waite: pi/2 split in three, the first two exact in n * c)
    sin r ~ r + r^3 P(r^2),  cos r ~ 1 - r^2/2 + r^4 Q(r^2)        on |r| <= pi/4 (Cephes' sinf/cosf minimax)

and the quadrant ``n mod 4`` swaps and negates the pair. Absolute error 9.2e-8 against float64 for
``|x| <= 2e4`` (``jnp.sin``: 3.3e-8; tests/test_sincos.py bounds it by 2e-7); where float32 cannot reduce the
argument at all (``|x| > ~1e9``) the pair is meaningless, as ``jnp.sin``'s is, but stays in ``[-1, 1]``. The
derivative is the exact one, ``(cos x, -sin x)``, from the same evaluation (a custom JVP), not the polynomial's.
"""

import jax
import jax.numpy as jnp

_TWO_OVER_PI = 0.63661977236758134
_PIO2 = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)  # sums to pi/2; the first two have few bits
_SIN = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
_COS = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)


@jax.custom_jvp
def sincos(x):
  """``(sin x, cos x)`` of a float32 array ``x`` (any shape), each shaped like ``x``."""
  n = jnp.round(x * _TWO_OVER_PI)
  r = ((x - n * _PIO2[0]) - n * _PIO2[1]) - n * _PIO2[2]
  r = jnp.clip(r, -0.8, 0.8)  # |r| <= pi/4 but where float32 cannot reduce x (|x| > ~1e9): keeps the pair in [-1, 1]
  r2 = r * r
  s = r + r * r2 * (_SIN[0] + r2 * (_SIN[1] + r2 * _SIN[2]))
  c = 1.0 - 0.5 * r2 + r2 * r2 * (_COS[0] + r2 * (_COS[1] + r2 * _COS[2]))
  q = n - 4.0 * jnp.floor(0.25 * n)  # the quadrant 0..3, in float (no integer overflow for huge x)
  odd = (q == 1.0) | (q == 3.0)
  sin = jnp.where(odd, c, s)
  cos = jnp.where(odd, s, c)
  sin = jnp.where(q >= 2.0, -sin, sin)
  cos = jnp.where((q == 1.0) | (q == 2.0), -cos, cos)
  return sin, cos


@sincos.defjvp
def _sincos_jvp(primals, tangents):
  (x,), (dx,) = primals, tangents
  s, c = sincos(x)
  return (s, c), (c * dx, -s * dx)
