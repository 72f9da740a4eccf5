"""Huge pages for malloc (``jaxwm.utils.hugepages``): when ``train.py`` restarts itself, with what, and that in the
restarted process glibc advises a 64 MiB malloc's mapping for 2 MiB pages (its ``VmFlags`` in ``/proc/self/smaps``)
and without the restart does not."""

import json
import os
import pathlib
import platform
import subprocess
import sys
import textwrap

import pytest

from jaxwm.utils import hugepages as hp

ARGV = ["python", "-X", "faulthandler", "-m", "jaxwm.play", "--port", "8001"]


def test_plan_restarts_with_the_tunable_and_the_same_command_line():
  env = {"PATH": "/bin", "JAX_PLATFORMS": "cpu"}
  argv, new = hp.plan(env, (2, 36), "madvise", ARGV, "/venv/bin/python3")
  assert argv == ["/venv/bin/python3", "-X", "faulthandler", "-m", "jaxwm.play", "--port", "8001"]
  assert new == {**env, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"} and "GLIBC_TUNABLES" not in env
  _, new = hp.plan({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, (2, 35), "madvise", ARGV, "/p")
  assert new["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"  # the user's kept


@pytest.mark.parametrize("env,glibc,thp,orig,exe,why", [
    ({"JAXWM_HUGEPAGES": "0"}, (2, 36), "madvise", ARGV, "/p", "JAXWM_HUGEPAGES=0"),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, (2, 36), "madvise", ARGV, "/p", "already"),  # the user decided
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, (2, 36), "madvise", ARGV, "/p", "already"),  # restarted once
    ({}, (2, 34), "madvise", ARGV, "/p", "glibc >= 2.35"),
    ({}, None, "madvise", ARGV, "/p", "glibc >= 2.35"),  # musl, macOS
    ({}, (2, 36), "always", ARGV, "/p", "'always'"),  # huge pages already
    ({}, (2, 36), "never", ARGV, "/p", "'never'"),
    ({}, (2, 36), None, ARGV, "/p", "None"),  # no THP in this kernel
    ({}, (2, 36), "madvise", None, "/p", "no interpreter"),
    ({}, (2, 36), "madvise", ARGV, "", "no interpreter"),
])
def test_plan_goes_on_unchanged_where_it_cannot_help_or_is_decided(env, glibc, thp, orig, exe, why):
  argv, reason = hp.plan(env, glibc, thp, orig, exe)
  assert argv is None and why in reason


def test_thp_mode_and_glibc_version_read_the_host(tmp_path):
  f = tmp_path / "enabled"
  f.write_text("always [madvise] never\n")
  assert hp.thp_mode(str(f)) == "madvise"
  f.write_text("[always] madvise never\n")
  assert hp.thp_mode(str(f)) == "always"
  assert hp.thp_mode(str(tmp_path / "missing")) is None
  lib, version = platform.libc_ver()  # independently: the interpreter binary's own glibc symbol versions
  if lib == "glibc":
    assert hp.glibc_version() == tuple(int(x) for x in version.split(".")[:2])
  else:
    assert hp.glibc_version() is None


_PROBE = textwrap.dedent("""\
    import ctypes, json, os, resource, sys
    from jaxwm.utils import hugepages
    hugepages.reexec()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    n = 64 << 20
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    advised = None  # the mapping holding the buffer: advised for huge pages ("hg" in its VmFlags)?
    with open("/proc/self/smaps") as f:
      inside = False
      for line in f:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
          lo, hi = (int(x, 16) for x in head.split("-"))
          inside = lo <= p < hi
        elif inside and head == "VmFlags:":
          advised = "hg" in line.split()[1:]
    print(json.dumps({"argv": sys.argv[1:], "name": __spec__.name if __spec__ else None, "advised": advised,
                      "tunables": os.environ.get("GLIBC_TUNABLES"), "faults": faults, "enabled": hugepages.enabled()}))
""")


def _probe(tmp_path, env_extra, module):
  (tmp_path / "probe_pkg").mkdir(exist_ok=True)
  (tmp_path / "probe_pkg" / "__init__.py").write_text("")
  (tmp_path / "probe_pkg" / "probe.py").write_text(_PROBE)
  env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "JAXWM_HUGEPAGES")}
  # the probe's package and the repository only: a worker's sys.path may hold benchmarks/, where a module named as
  # one of the standard library's would shadow it (benchmarks/encodings.py did, and the interpreter could not start)
  env.update(env_extra, PYTHONPATH=os.pathsep.join([str(tmp_path), str(pathlib.Path(__file__).resolve().parents[1])]))
  script = str(tmp_path / "probe_pkg" / "probe.py")
  cmd = [sys.executable, "-m", "probe_pkg.probe"] if module else [sys.executable, script]
  out = subprocess.run([*cmd, "a", "--b=1"], env=env, capture_output=True, text=True, timeout=60, check=False)
  assert out.returncode == 0, f"the probe exited {out.returncode}: {out.stderr[-2000:]}"
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(hp.plan({}, hp.glibc_version(), hp.thp_mode(), ["python"], sys.executable)[0] is None,
                    reason="this host has no use for the restart (glibc < 2.35 or THP not in madvise mode)")
@pytest.mark.parametrize("module", [False, True], ids=["script", "python -m"])
def test_the_restarted_process_advises_huge_pages_and_the_opt_out_does_not(tmp_path, module):
  on = _probe(tmp_path, {}, module)
  assert on["tunables"] == "glibc.malloc.hugetlb=1" and on["enabled"] and on["argv"] == ["a", "--b=1"]
  assert on["name"] == ("probe_pkg.probe" if module else None)  # `python -m` restarts as a module
  off = _probe(tmp_path, {"JAXWM_HUGEPAGES": "0"}, module)
  assert off["tunables"] is None and not off["enabled"]
  # glibc advised the buffer's mapping for huge pages only in the restarted process. Whether the kernel then hands
  # out 2 MiB pages depends on its free memory (on a quiet host: ~500 faults against 16,384), so only the advice,
  # which is deterministic, is asserted.
  assert on["advised"] is True and off["advised"] is False, (on, off)
