"""Memory policies (docs/design.md §8): landmark admission/eviction/retrieval on hand-worked
trajectories, panorama coverage against brute-force counting and its rules, and every policy
equal to the full cache while the history fits; bounded rollouts compile once."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwm.geometry.rotations import rotation_about_axis
from jaxwm.geometry.sphere import fibonacci_sphere
from jaxwm.memory import FullMemory, LandmarkMemory, MemoryPolicy, PanoramaMemory, WindowMemory, make_policy
from jaxwm.memory.panorama import coverage

K = np.array([[16.0, 0, 8], [0, 16, 8], [0, 0, 1]])


def _poses(xs, yaws=None):
  out = np.tile(np.eye(4), (len(xs), 1, 1))
  out[:, 0, 3] = xs
  if yaws is not None:
    out[:, :3, :3] = np.asarray([rotation_about_axis(np.deg2rad(a), 1) for a in yaws])
  return out


def _feed(policy, poses, chunk):
  """Frame 0 alone, then chunks of ``chunk`` frames."""
  policy.update([0], poses[:1], np.tile(K, (1, 1, 1)))
  for lo in range(1, len(poses), chunk):
    idx = list(range(lo, min(lo + chunk, len(poses))))
    policy.update(idx, poses[idx], np.tile(K, (len(idx), 1, 1)))
  return policy


def test_window_keeps_the_sink_and_the_latest_frames():
  p = _feed(WindowMemory(sink=1, window=4), _poses(np.arange(11.0)), 2)
  assert p.resident() == [0, 7, 8, 9, 10] and p.capacity == 5


def test_landmark_straight_line_by_hand():
  # Frames at x = 0, 1, 2, ...; chunk c >= 1 holds frames 2c-1, 2c; every step is 1, so stride 4 = 4 units.
  p = _feed(LandmarkMemory(2, recent=2, retrieved=2, bank_size=3, stride=4.0), _poses(np.arange(19.0)), 2)
  # Chunks leaving the window: 1 (first: admitted), 2 (travelled 2: no), 3 (4: yes), 4 (no), 5 (yes), 6 (no),
  # 7 (yes) -> bank 1, 3, 5, 7 over capacity 3: 1 and 3 protected, 5 and 7 tie (nearest neighbours 4 apart),
  # the newer (7) is evicted.
  assert p.bank == [1, 3, 5]
  assert p.retrieved == [5, 3]  # nearest the current chunk (9, at x = 17.5) first
  assert p.resident() == [0, 5, 6, 9, 10, 15, 16, 17, 18]
  assert p.banked() == {1, 2, 5, 6, 9, 10}


def test_landmark_out_and_back_retrieves_the_first_visit():
  xs = np.concatenate([np.arange(0.0, 24.0), np.arange(24.0, -1.0, -1.0)])  # out 24 units and back
  p = _feed(LandmarkMemory(2, recent=2, retrieved=2, bank_size=30, stride=4.0), _poses(xs), 2)
  last = p.chunks[p.recent[-1]]["t"][0]
  assert last < 1.5
  # The return pass is admitted like the outbound one (an odometer, not "already banked").
  outbound = [c for c in p.bank if p.chunks[c]["frames"][0] < 24]
  inbound = [c for c in p.bank if p.chunks[c]["frames"][0] >= 25]
  assert outbound and inbound
  # Near the start again (x = 0.5) the nearest landmarks are the first visit's chunks 1 (x = 1.5) and 3
  # (x = 5.5), ahead of the return pass's nearest banked chunk (x = 6.5; later ones are still recent).
  assert p.retrieved == [1, 3]


def test_landmark_look_ahead_retrieves_by_the_next_chunk():
  # Out to x = 6, a pause, then a jump back. After chunk 4 (frames 7, 8 at x = 6) the current pose is
  # nearest chunk 3 (x = 5.5); the next chunk (frames 9, 10 at x = 1, 0) is nearest chunk 1 (x = 1.5).
  poses = _poses(np.asarray([0.0, 1, 2, 3, 4, 5, 6, 6, 6, 1, 0]))
  for by, want in (("current", [3]), ("next", [1])):
    p = _feed(LandmarkMemory(2, recent=1, retrieved=1, stride=0.5, retrieve_by=by), poses[:9], 2)
    assert p.bank == [1, 2, 3]
    p.look_ahead(poses[9:11])
    assert p.retrieved == want, by
    assert set(p.chunks[want[0]]["frames"]) <= set(p.resident())
  with pytest.raises(ValueError, match="retrieve_by"):
    LandmarkMemory(2, retrieve_by="future")


def test_landmark_rotation_only_loop_uses_the_angle():
  yaws = np.concatenate([np.arange(0, 180, 10), np.arange(180, -10, -10)])  # turn 180 degrees and back
  p = _feed(LandmarkMemory(2, recent=2, retrieved=1, bank_size=30, stride=3.0, rotation_weight=1.0),
            _poses(np.zeros(len(yaws)), yaws), 2)
  assert len(p.bank) >= 4  # without the angle nothing would ever travel
  (nearest,) = p.retrieved
  first_yaw = lambda c: yaws[p.chunks[c]["frames"][0]]
  assert first_yaw(nearest) <= 20 and p.chunks[nearest]["frames"][0] < 20  # the outbound start


def test_landmark_protected_members_are_never_evicted():
  # The first two landmarks sit 0.1 apart (the most redundant pair), later ones far apart.
  xs = [0.0, 0.0, 0.0, 0.1, 0.1] + [10.0 * i for i in range(1, 14)]
  p = _feed(LandmarkMemory(2, recent=1, retrieved=1, bank_size=3, stride=0.0), _poses(np.asarray(xs)), 2)
  assert p.bank[:2] == [1, 2]
  assert len(p.bank) == 3


def _brute_coverage(f, others, c2w, k, image_hw, dirs, radius):
  """Direction-by-direction counting with explicit projections (float64)."""
  def sees(i, d):
    cam = c2w[i, :3, :3].T @ d
    if cam[2] <= 1e-9:
      return False
    u, v = (k @ (cam / cam[2]))[:2]
    return 0 <= u <= image_hw[1] and 0 <= v <= image_hw[0]
  mine = [d for d in dirs if sees(f, d)]
  if not mine:
    return 1.0
  near = [o for o in others if np.linalg.norm(c2w[o, :3, 3] - c2w[f, :3, 3]) < radius]
  return sum(any(sees(o, d) for o in near) for d in mine) / len(mine)


def test_panorama_coverage_against_brute_force():
  rng = np.random.default_rng(0)
  n = 6
  yaws = rng.uniform(-90, 90, n)
  c2w = _poses(rng.uniform(-5, 5, n), yaws)
  p = PanoramaMemory((16, 16), directions=512)
  p.update(list(range(n)), c2w, np.tile(K, (n, 1, 1)))
  for f in range(n):
    others = [o for o in range(n) if o != f]
    got = p.cov(f, others)
    want = _brute_coverage(f, others, c2w, K, (16, 16), p.dirs, 6.0)
    assert abs(got - want) < 1e-9, (f, got, want)
  assert coverage(np.zeros(4, bool), np.zeros(3), [], [], 6.0) == 1.0


def test_panorama_admission_and_tie_rule():
  # Same view as the sink: never new enough. Turned 180 degrees: all new.
  p = PanoramaMemory((16, 16), bank_size=20, recent=1, directions=1024)
  p.update([0, 1, 2], _poses(np.zeros(3), [0, 0, 180]), np.tile(K, (3, 1, 1)))
  assert p.bank == [] and p.recent == [2]
  p.update([3], _poses(np.zeros(1), [0]), np.tile(K, (1, 1, 1)))
  assert p.bank == [2]
  # Ties: identical new views fill a one-frame bank; each is fully covered by the other, the newer goes.
  q = PanoramaMemory((16, 16), bank_size=1, recent=1, directions=1024, min_new=0.0)
  q.update([0, 1, 2, 3], _poses(np.zeros(4), [0, 90, 90, 0]), np.tile(K, (4, 1, 1)))
  assert q.bank == [1] and q.resident() == [0, 1, 3]
  # Centres further than the radius do not count toward coverage.
  far = PanoramaMemory((16, 16), bank_size=20, recent=1, directions=1024, radius=6.0)
  far.update([0, 1, 2], _poses(np.asarray([0.0, 10.0, 10.0]), [0, 0, 0]), np.tile(K, (3, 1, 1)))
  assert far.bank == [1]


# --- rollouts ---------------------------------------------------------------------------------------------

SLOTS = 10  # one device buffer for every rollout of these tests: one compile


@functools.lru_cache(maxsize=None)
def _sampler(max_frames):
  from jaxwm.models.config import CameraConfig, ModelConfig  # pylint: disable=g-import-not-at-top
  from jaxwm.models.transformer import WanModel  # pylint: disable=g-import-not-at-top
  from jaxwm.sampling.streaming import StreamingSampler  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig(dim=64, num_heads=2, num_layers=2, ffn_dim=64, in_channels=12, out_channels=12, freq_dim=32,
                    camera=CameraConfig(encoding="viewrope"))
  model = WanModel(cfg)
  x = jnp.zeros((1, 1, 4, 4, 12))
  from jaxwm.models.conditioning import Cameras, Frames  # pylint: disable=g-import-not-at-top
  cams = Cameras(jnp.eye(4)[None, None], jnp.asarray(K, jnp.float32)[None, None])
  frames = Frames.sequence(1, 1, cameras=cams)
  variables = nn.unbox(jax.jit(lambda k: model.init(k, x, jnp.zeros((1, 1)), frames))(jax.random.key(0)))
  return StreamingSampler(model, variables, batch_size=1, max_frames=max_frames, latent_hw=(4, 4), channels=12,
                          num_steps=2)


@pytest.fixture(scope="module")
def trajectory():
  n = 9
  yaws = np.concatenate([np.linspace(0, 60, 5), np.linspace(45, 0, 4)])
  c2w = _poses(np.linspace(0, 1, n), yaws)
  return {"c2w": jnp.asarray(c2w, jnp.float32)[None], "intrinsics": jnp.asarray(np.tile(K, (n, 1, 1)), jnp.float32)[None]}


def test_every_policy_equals_the_full_cache_while_the_history_fits(trajectory):
  sampler = _sampler(SLOTS)
  first = jax.random.normal(jax.random.key(1), (1, 1, 4, 4, 12))
  full = sampler.rollout(first, 9, 2, jax.random.key(2), trajectory)
  policies = {"window": WindowMemory(sink=1, window=8), "landmark": LandmarkMemory(2, recent=3, retrieved=1),
              "panorama": PanoramaMemory((16, 16), bank_size=1, recent=8)}
  for name, policy in policies.items():
    out = sampler.rollout(first, 9, 2, jax.random.key(2), trajectory, memory=policy, slots=SLOTS)
    np.testing.assert_allclose(out, full, atol=1e-5, rtol=1e-5, err_msg=name)


def test_bounded_rollouts_compile_once_and_forget(trajectory):
  from jaxwm.sampling import streaming  # pylint: disable=g-import-not-at-top
  sampler = _sampler(SLOTS)
  first = jax.random.normal(jax.random.key(1), (1, 1, 4, 4, 12))
  full = sampler.rollout(first, 9, 2, jax.random.key(2), trajectory)
  policy = make_policy("window", max_frames=9, chunk_frames=2, image_hw=(16, 16), sink=1, window=2)
  before = streaming._denoise_jit._cache_size()  # pylint: disable=protected-access
  out = sampler.rollout(first, 9, 2, jax.random.key(2), trajectory, memory=policy, slots=SLOTS)
  assert streaming._denoise_jit._cache_size() == before  # the same buffer: no compile for any chunk
  np.testing.assert_allclose(out[:, :5], full[:, :5], atol=1e-5)  # frames 1-4 saw the whole (3-frame) history
  assert float(np.abs(out[:, 5:] - full[:, 5:]).max()) > 1e-4  # later chunks lost frames 1-2
  assert policy.resident() == [0, 7, 8]
  lm = LandmarkMemory(2, recent=1, retrieved=1, bank_size=2, stride=0.5)
  out = sampler.rollout(first, 9, 2, jax.random.key(2), trajectory, memory=lm, slots=SLOTS)
  small = WindowMemory(sink=1, window=2)
  before = streaming._denoise_jit._cache_size()  # pylint: disable=protected-access
  sampler.rollout(first, 9, 2, jax.random.key(2), trajectory, memory=small)  # its own 3-slot buffer
  assert streaming._denoise_jit._cache_size() - before == 1  # one shape of cache: one compile for all chunks
  assert np.all(np.isfinite(out)) and lm.bank  # banked chunks went to host and came back when retrieved
  with pytest.raises(ValueError, match="memory policy must be one of"):
    make_policy("lru", max_frames=9, chunk_frames=2, image_hw=(16, 16))
  assert isinstance(make_policy("full", max_frames=9, chunk_frames=2, image_hw=(16, 16)), FullMemory)


def _policies():
  return {"full": FullMemory(SLOTS), "window": WindowMemory(sink=1, window=2),
          "landmark": LandmarkMemory(2, recent=1, retrieved=1, bank_size=2, stride=0.5),
          "landmark_next": LandmarkMemory(2, recent=1, retrieved=1, bank_size=2, stride=0.5, retrieve_by="next"),
          "panorama": PanoramaMemory((16, 16), bank_size=1, recent=2)}


def test_a_session_under_every_policy_equals_the_rollout_on_the_same_poses(trajectory):
  """Cameras given chunk by chunk, the next chunk unknown: the frames equal a rollout's that knew the whole
  trajectory, bit for bit, under each policy (the policy's look-ahead sees the next chunk's poses in both)."""
  sampler = _sampler(SLOTS)
  first = jax.random.normal(jax.random.key(1), (1, 1, 4, 4, 12))
  cams = {k: np.asarray(v) for k, v in trajectory.items()}
  for name in _policies():
    ref = sampler.rollout(first, 9, 2, jax.random.key(2), trajectory, memory=_policies()[name], slots=SLOTS)
    session = sampler.session(first, jax.random.key(2), {k: v[:, :1] for k, v in cams.items()},
                              memory=_policies()[name], slots=SLOTS)
    for lo in range(1, 9, 2):
      session.next({k: v[:, lo:lo + 2] for k, v in cams.items()})
    np.testing.assert_array_equal(session.frames, ref, err_msg=name)


def test_a_session_under_a_bounded_policy_has_no_length_limit(trajectory):
  """A walk 5x longer than the device buffer (10 slots, 49 frames) under the window policy: one compiled step
  for every chunk, a cache of fixed size, the same frames for the same key and poses; the full memory refuses
  to grow past its slots with a message naming the way out."""
  from jaxwm.sampling import streaming  # pylint: disable=g-import-not-at-top
  sampler = _sampler(SLOTS)
  first = jax.random.normal(jax.random.key(1), (1, 1, 4, 4, 12))
  n = 49
  yaws = 30 * np.sin(np.linspace(0, 6, n))
  c2w = _poses(np.linspace(0, 3, n), yaws)[None].astype(np.float32)
  k = np.tile(K, (1, n, 1, 1)).astype(np.float32)
  runs = []
  for _ in range(2):
    session = sampler.session(first, jax.random.key(3), {"c2w": c2w[:, :1], "intrinsics": k[:, :1]},
                              memory=WindowMemory(sink=1, window=4), slots=SLOTS, keep_frames=False)
    shapes = jax.tree_util.tree_map(lambda a: a.shape, session.cache)
    out = []
    for lo in range(1, n, 2):
      out.append(session.next({"c2w": c2w[:, lo:lo + 2], "intrinsics": k[:, lo:lo + 2]}))
      if lo == 3:
        compiled = streaming._denoise_jit._cache_size()  # pylint: disable=protected-access
      assert jax.tree_util.tree_map(lambda a: a.shape, session.cache) == shapes
    assert streaming._denoise_jit._cache_size() == compiled  # pylint: disable=protected-access
    assert session.memory.resident() == [0, 43, 44, 45, 46] and session.frames.shape[1] == 2  # 47-48: not yet committed
    runs.append(np.concatenate(out, axis=1))
  np.testing.assert_array_equal(runs[0], runs[1])
  assert np.all(np.isfinite(runs[0]))
  full = sampler.session(first, jax.random.key(3), {"c2w": c2w[:, :1], "intrinsics": k[:, :1]})
  for lo in range(1, 9, 2):
    full.next({"c2w": c2w[:, lo:lo + 2], "intrinsics": k[:, lo:lo + 2]})
  with pytest.raises(ValueError, match="free cache slots .* bounded memory policy"):
    full.next({"c2w": c2w[:, 9:11], "intrinsics": k[:, 9:11]})


class _SinkAndLastChunk(MemoryPolicy):
  """A new policy as a user would add one: frame 0 and the latest chunk (sized from the rollout's chunks)."""

  name = "sink_and_last_chunk"

  @classmethod
  def build(cls, *, max_frames, chunk_frames, image_hw, **kwargs):
    del max_frames, image_hw
    return cls(chunk_frames, **kwargs)

  def __init__(self, chunk_frames):
    self.chunk, self.capacity, self._frames = chunk_frames, 1 + chunk_frames, []

  def update(self, frames, c2w, intrinsics):
    self._frames += [int(f) for f in frames]

  def resident(self):
    return self._frames[:1] + self._frames[1:][-self.chunk:]


def test_a_new_policy_is_one_class_and_one_registry_line(trajectory, monkeypatch):
  """The class above plus ``register_policy`` (in the tree: its module name in ``jaxwm.memory.MODULES``): built by
  name with the rollout's sizes, and it streams the same frames as the window policy it equals."""
  from jaxwm import memory  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(memory, "POLICIES", dict(memory.POLICIES))
  memory.register_policy(_SinkAndLastChunk)
  policy = make_policy("sink_and_last_chunk", max_frames=9, chunk_frames=2, image_hw=(16, 16))
  assert policy.capacity == 3
  sampler = _sampler(SLOTS)
  first = jax.random.normal(jax.random.key(1), (1, 1, 4, 4, 12))
  out = sampler.rollout(first, 9, 2, jax.random.key(2), trajectory, memory=policy, slots=SLOTS)
  ref = sampler.rollout(first, 9, 2, jax.random.key(2), trajectory, memory=WindowMemory(sink=1, window=2),
                        slots=SLOTS)
  np.testing.assert_array_equal(out, ref)
  assert policy.resident() == [0, 7, 8]
  with pytest.raises(ValueError, match="already registered"):
    memory.register_policy(type("Clash", (_SinkAndLastChunk,), {}))
  with pytest.raises(ValueError, match="named MemoryPolicy subclass"):
    memory.register_policy(dict)
