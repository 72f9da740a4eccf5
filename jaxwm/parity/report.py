"""A parity report: one row per compared tensor (an activation, an output, a gradient group), each with the
largest absolute difference and that difference relative to the reference's largest magnitude.

  rel = max |ours - ref| / max |ref|

Relative to the largest magnitude, not element-wise: an element near zero cannot make a correct port fail.
A row passes when ``rel <= tol``; the report passes when every row does. NaN or a shape mismatch fails.

In bfloat16 the reference is the PyTorch model run in float32 on the same (bfloat16-rounded) weights, and each
row also carries ``peer_rel``, the PyTorch model's own error in bfloat16 against that reference: jaxwm passes
when it is no further from the float32 result than ``PEER_FACTOR`` times PyTorch's bfloat16 run (or within
``tol``). That holds any model to the precision its own arithmetic allows, however much its random weights
amplify rounding.
"""

import dataclasses
import math

import numpy as np

# The tolerance per compute dtype. float32: a correct port differs by summation order only (measured on the
# tests' random checkpoints: <= 2e-6 for activations, <= 3e-5 for gradient groups); bfloat16: both sides round
# every matmul input to 8 bits of mantissa (about 4e-3 per operation), and the errors grow through the layers.
TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2}
PEER_FACTOR = 2.0


@dataclasses.dataclass
class Row:
  section: str  # "activation", "output", "gradient"
  name: str
  shape: tuple
  max_abs: float
  rel: float
  ref_max: float
  peer_rel: float = None  # bfloat16: PyTorch's own bfloat16 error against the float32 reference

  def passed(self, tol):
    bound = tol if self.peer_rel is None else max(tol, PEER_FACTOR * self.peer_rel)
    return math.isfinite(self.rel) and self.rel <= bound


@dataclasses.dataclass
class Report:
  """Rows of one model's comparison; ``meta`` says what was run (model, files, shapes, dtype, seed)."""
  meta: dict
  tol: float
  rows: list = dataclasses.field(default_factory=list)

  def add(self, section, name, ours, ref, peer=None):
    """A row comparing ``ours`` with ``ref``; ``peer`` (bfloat16): PyTorch's bfloat16 result of the same."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape:
      self.rows.append(Row(section, name, f"{ours.shape} vs reference {ref.shape}", math.inf, math.inf, math.nan))
      return
    diff, ref_max, rel = _rel(ours, ref)
    peer_rel = None if peer is None else _rel(np.asarray(peer, np.float64), ref)[2]
    self.rows.append(Row(section, name, tuple(ours.shape), diff, rel, ref_max, peer_rel))

  @property
  def passed(self):
    return bool(self.rows) and all(r.passed(self.tol) for r in self.rows)

  def worst(self):
    return max(self.rows, key=lambda r: r.rel if math.isfinite(r.rel) else math.inf)

  def table(self):
    """The report as fixed-width text: a header line, one line per row, a verdict line."""
    peer = any(r.peer_rel is not None for r in self.rows)
    head = f"{'':2}{'section':<11}{'tensor':<34}{'shape':<20}{'max |diff|':>12}{'rel':>11}" + (
        f"{'torch bf16 rel':>16}" if peer else "")
    lines = [" ".join(f"{k}={v}" for k, v in self.meta.items()), head]
    for r in self.rows:
      mark = "  " if r.passed(self.tol) else "! "
      shape = "x".join(map(str, r.shape)) if isinstance(r.shape, tuple) else r.shape
      lines.append(f"{mark}{r.section:<11}{r.name:<34}{shape:<20}{r.max_abs:>12.3e}{r.rel:>11.2e}" + (
          f"{r.peer_rel:>16.2e}" if r.peer_rel is not None else ""))
    w = self.worst()
    verdict = "PASS" if self.passed else "FAIL"
    rule = f"tolerance {self.tol:g}" + (f", or {PEER_FACTOR:g}x torch's own bfloat16 error against its float32 run"
                                        if peer else "")
    lines.append(f"{verdict}: {len(self.rows)} tensors, worst rel {w.rel:.2e} ({w.section} {w.name}); {rule}")
    return "\n".join(lines)

  def to_json(self):
    return {"meta": self.meta, "tolerance": self.tol, "passed": self.passed,
            "rows": [dataclasses.asdict(r) | {"shape": list(r.shape) if isinstance(r.shape, tuple) else r.shape,
                                              "passed": r.passed(self.tol)} for r in self.rows]}


def _rel(ours, ref):
  diff = float(np.max(np.abs(ours - ref))) if ours.size else 0.0
  ref_max = float(np.max(np.abs(ref))) if ref.size else 0.0
  if not (np.all(np.isfinite(ours)) and np.all(np.isfinite(ref))):
    diff = math.nan
  return diff, ref_max, diff / ref_max if ref_max > 0 else (0.0 if diff == 0 else math.inf)


def group_gradients(report, ours, ref, group_of, peer=None):
  """Adds one ``gradient`` row per parameter group: ``ours`` and ``ref`` (and ``peer``) map reference parameter
  names to arrays; ``group_of(name)`` names the group. The arrays of a group are compared as one flat vector."""
  if set(ours) != set(ref):
    missing = sorted(set(ref) - set(ours))[:3]
    extra = sorted(set(ours) - set(ref))[:3]
    raise ValueError(f"gradient names differ: missing {missing}, extra {extra}")
  groups = {}
  for name in ref:
    groups.setdefault(group_of(name), []).append(name)
  flat = lambda d, names: np.concatenate([np.ravel(np.asarray(d[n], np.float64)) for n in names])  # pylint: disable=unnecessary-lambda-assignment
  for g, names in groups.items():
    report.add("gradient", g, flat(ours, names), flat(ref, names), None if peer is None else flat(peer, names))
