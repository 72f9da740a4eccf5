"""One process of ``tests/test_distributed.py``: ``python distributed_worker.py <process_id> <port> <workdir>``.

Trains the tiny test config with ``jaxwm.training.loop.run`` as process ``<process_id>`` of a 2-process
run on localhost (4 CPU devices each; ``run`` joins it from ``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``, with gloo collectives) and writes its loss history and the
indices of the records it read to ``<workdir>/process_<id>.json``; stopped by a signal (to either process), it
records the agreed step instead and exits with code 75, as ``train.py``.
"""

import json
import os
import signal
import sys

pid, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"  # conftest adds the tests' compile flags
os.environ.update(JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(pid))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import tiny_config  # noqa: E402  pylint: disable=g-import-not-at-top
import jax  # noqa: E402  pylint: disable=g-import-not-at-top,g-bad-import-order
from jaxwm.evaluation.hooks import training_hooks  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxwm.training import data as data_lib  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxwm.training.loop import run  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxwm.training.runner import STOPPED_EXIT_CODE, StopRequested  # noqa: E402  pylint: disable=g-import-not-at-top

config = tiny_config(**json.loads(os.environ["JAXWM_TEST_OVERRIDES"]))
read = []
make_source = data_lib.make_source


class _Recording:
  """The data source, recording which records this process reads."""

  def __init__(self, source):
    self.source = source

  def __len__(self):
    return len(self.source)

  def __repr__(self):  # grain checks a restored iterator's source by its repr
    return repr(self.source)

  def __getitem__(self, i):
    read.append(int(i))
    return self.source[i]


data_lib.make_source = lambda *a, **kw: _Recording(make_source(*a, **kw))
try:
  _, history = run(config, os.path.join(workdir, "run"), progress=False, hooks=training_hooks(config))
  report, code = {"history": history}, 0
except StopRequested as e:  # as train.py: the agreed step is committed; exit 75
  for name in ("SIGTERM", "SIGINT"):  # as train.py: a further signal during shutdown must not change the code
    signal.signal(getattr(signal, name), signal.SIG_IGN)
  report, code = {"stopped": e.step, "signal": e.signame}, STOPPED_EXIT_CODE
with open(os.path.join(workdir, f"process_{pid}.json"), "w", encoding="utf-8") as f:
  json.dump({**report, "read": read, "devices": jax.local_device_count(), "processes": jax.process_count()}, f)
sys.exit(code)
