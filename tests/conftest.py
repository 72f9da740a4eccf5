"""Test setup: CPU only, 8 fake devices, absl flags marked parsed, shared fixtures."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from absl import flags  # noqa: E402

# grain's multiprocess loader and other absl users read flags; pytest never parses them.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()


@pytest.fixture(scope="session")
def rng():
  return np.random.default_rng(0)


def random_rotations(rng, n):
  """``[n, 3, 3]`` float64 uniformly random rotations (QR of Gaussians, det fixed to +1)."""
  q, r = np.linalg.qr(rng.normal(size=(n, 3, 3)))
  q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
  q[np.linalg.det(q) < 0, :, 0] *= -1
  return q


def random_poses(rng, n, scale=2.0):
  """``[n, 4, 4]`` float64 random rigid camera-to-world transforms."""
  t = np.tile(np.eye(4), (n, 1, 1))
  t[:, :3, :3] = random_rotations(rng, n)
  t[:, :3, 3] = rng.normal(scale=scale, size=(n, 3))
  return t


def random_intrinsics(rng, n, hw=(48, 64)):
  """``[n, 3, 3]`` float64 pinhole intrinsics with some skew-free variety."""
  h, w = hw
  k = np.zeros((n, 3, 3))
  k[:, 0, 0] = rng.uniform(0.6, 1.4, n) * w
  k[:, 1, 1] = rng.uniform(0.6, 1.4, n) * w
  k[:, 0, 2] = w / 2 + rng.uniform(-3, 3, n)
  k[:, 1, 2] = h / 2 + rng.uniform(-3, 3, n)
  k[:, 2, 2] = 1
  return k
