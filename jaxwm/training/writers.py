"""Where a run's scalars and notes go: TensorBoard event files and ``metrics.jsonl`` (process 0), both rewound to
the restored step on resume, and :func:`say` for one-line notes under the progress bar."""

import json
import os

import jax
from tqdm import tqdm


def say(msg):
  """One line under the progress bar, from process 0 only."""
  if jax.process_index() == 0:
    tqdm.write(msg)


class MetricWriters:
  """Scalars to TensorBoard event files and a JSONL file (process 0 only), both rewound to ``start``:
  ``metrics.jsonl`` loses its lines of steps > ``start`` (and torn lines), TensorBoard purges events
  of steps > ``start`` (``purge_step``), so replayed steps are recorded once."""

  def __init__(self, workdir, start=0):
    self.active = jax.process_index() == 0
    if self.active:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      rewind_jsonl(workdir / "metrics.jsonl", start)
      purge = start + 1 if list((workdir / "tb").glob("events.out.tfevents.*")) else None
      self.tb = SummaryWriter(str(workdir / "tb"), purge_step=purge)
      self.jsonl = open(workdir / "metrics.jsonl", "a", encoding="utf-8")

  def write(self, step, scalars):
    if not self.active:
      return
    for k, v in scalars.items():
      self.tb.add_scalar(k, v, step)
    self.jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self.jsonl.flush()

  def close(self):
    if self.active:
      self.tb.close()
      self.jsonl.close()


def rewind_jsonl(path, step):
  """Drops the lines of ``path`` with ``"step" > step`` (and unparsable ones: a write cut by a kill),
  rewriting it atomically; says how many."""
  if not path.exists():
    return
  lines = path.read_text(encoding="utf-8").splitlines()
  keep, torn = [], 0
  for line in lines:
    try:
      if json.loads(line)["step"] <= step:
        keep.append(line)
    except (ValueError, KeyError, TypeError):
      torn += 1
  if len(keep) == len(lines):
    return
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
  os.replace(tmp, path)
  say(f"rewound {path} to step {step}: dropped {len(lines) - len(keep) - torn} line(s) of later steps"
       + (f" and {torn} unreadable line(s)" if torn else "") + " (training replays them)")
