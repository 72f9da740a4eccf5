"""Transparent huge pages for XLA:CPU's buffers, by restarting a command-line tool once with glibc's
``glibc.malloc.hugetlb=1`` tunable.

XLA:CPU allocates each step's buffers with ``malloc``. Large buffers come from fresh ``mmap``\\ s, and the kernel
zero-fills their 4 KiB pages on first touch: about 162,000 page faults per training step of the default model.
Where transparent huge pages are in ``madvise`` mode (as on the machines measured here), glibc 2.35 and newer advise
its mappings for 2 MiB pages when the tunable is set: under 1,000 faults per step, fewer TLB misses, the default
model's training step 10-20% shorter on a 2-core CPU and ``python train.py`` 8% shorter end to end
(BENCHMARKS.md, "Huge pages"). Numerics are unchanged (the same losses, bit for bit): only where memory comes from
changes.

Only training restarts itself (``train.py`` / ``jaxwm-train``: :func:`reexec` first thing). Sampling is
dominated by compilation and small buffers, where zeroing whole 2 MiB pages costs more than it saves: ``sample.py``
for one clip took 13.1-13.7 s against 12.0-12.4 s, and the loop-closure benchmark on 12 loops 51 s against 44 s, so
they do not. A distillation run (also ``train.py``) neither gains nor loses measurably. A library import never
restarts anything.

glibc reads tunables once, at process start, so :func:`reexec` restarts the process (``os.execve``: same pid,
same arguments, same ``python -m`` form) with ``GLIBC_TUNABLES`` extended. It does nothing when the setting cannot
help or is already decided: not Linux with glibc >= 2.35, transparent huge pages not in ``madvise`` mode
(``always`` needs nothing; ``never`` cannot help), ``glibc.malloc.hugetlb`` already in ``GLIBC_TUNABLES`` (so it
runs at most once, and a user's own choice stands), or ``JAXWM_HUGEPAGES=0`` (the opt-out). Training from a
notebook: start the kernel with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` in its environment.
"""

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT = "JAXWM_HUGEPAGES"
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"


def glibc_version():
  """``(major, minor)`` of the running glibc, or None (not glibc)."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    major, minor = version.split(".")[:2]
    return (int(major), int(minor)) if name == "glibc" else None
  except (AttributeError, ValueError, OSError):
    return None


def thp_mode(path=THP_MODE_FILE):
  """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None when unknown."""
  try:
    with open(path, encoding="ascii") as f:
      text = f.read()
  except OSError:
    return None
  return text[text.index("[") + 1:text.index("]")] if "[" in text and "]" in text else None


def plan(env, glibc, thp, orig_argv, executable):
  """``(argv, env)`` to restart with, or ``(None, why)`` when the process should go on as it is.

  Args:
    env: the process environment (a mapping; not modified).
    glibc: :func:`glibc_version`; thp: :func:`thp_mode`.
    orig_argv: the interpreter's command line (``sys.orig_argv``: keeps ``-m module`` and interpreter options).
    executable: ``sys.executable``.
  """
  if env.get(OPT_OUT, "1") == "0":
    return None, f"{OPT_OUT}=0"
  if TUNABLE in env.get("GLIBC_TUNABLES", ""):
    return None, f"GLIBC_TUNABLES already sets {TUNABLE}"
  if glibc is None or glibc < (2, 35):
    return None, f"needs glibc >= 2.35 (this process: {glibc})"
  if thp != "madvise":
    return None, f"transparent huge pages are {thp!r}, not 'madvise'"
  if not executable or not orig_argv:
    return None, "no interpreter path to restart"
  tunables = ":".join(t for t in (env.get("GLIBC_TUNABLES", ""), f"{TUNABLE}=1") if t)
  return [executable, *orig_argv[1:]], {**env, "GLIBC_TUNABLES": tunables}


def enabled(env=None):
  """Whether this process runs with huge pages for its ``malloc`` (the tunable set, or THP ``always``)."""
  env = os.environ if env is None else env
  return f"{TUNABLE}=1" in env.get("GLIBC_TUNABLES", "").split(":") or thp_mode() == "always"


def reexec():
  """Restarts this process with ``glibc.malloc.hugetlb=1`` when :func:`plan` says so; else returns. Call it before
  anything else has started (threads, files, devices): ``os.execve`` replaces the process image."""
  argv, env = plan(os.environ, glibc_version(), thp_mode(), getattr(sys, "orig_argv", None), sys.executable)
  if argv is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(argv[0], argv, env)
