"""Builds and loads the C++ kernels for XLA:CPU (``cpu_*.cc`` beside this file, with the shared headers
``cpu_blas.h``, the BLAS ``sgemm`` and a row-major product, ``cpu_ffi.h``, FFI binding helpers, and ``cpu_math.h``,
``exp`` and ``sincos``), and says how many OpenMP threads a call gets (:func:`threads`); :func:`scipy_sgemm` hands
the kernels that multiply matrices scipy's BLAS ``sgemm``.

Each source is compiled with ``g++`` (or ``$CXX``) at first use into ``$JAXWM_KERNEL_CACHE`` (default
``~/.cache/jaxwm``; a read-only one falls back to the temporary directory), one file per source, header, jaxlib
version, flags and host CPU (``-march=native``: a cache shared by hosts with other CPUs keeps one file per CPU),
under a file lock, so that parallel test workers build it once.
"""

import ctypes
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile

import jax

HERE = pathlib.Path(__file__).parent
HEADERS = (HERE / "cpu_blas.h", HERE / "cpu_ffi.h", HERE / "cpu_math.h")
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", "-std=c++17")


def host_cpu():
  """The host CPU's model and instruction-set flags."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      info = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
  except OSError:
    info = []
  return platform.machine() + "".join(sorted(set(info)))


def _cache_dir():
  cache = pathlib.Path(os.environ.get("JAXWM_KERNEL_CACHE", pathlib.Path.home() / ".cache" / "jaxwm"))
  try:
    cache.mkdir(parents=True, exist_ok=True)
    writable = os.access(cache, os.W_OK)
  except OSError:
    writable = False
  if not writable:
    cache = pathlib.Path(tempfile.gettempdir()) / "jaxwm_kernels"
    cache.mkdir(parents=True, exist_ok=True)
  return cache


def _compile(source, path, fail):
  compiler = shutil.which(os.environ.get("CXX", "g++"))
  if compiler is None:
    fail("builds a C++ kernel with g++ (or $CXX), which was not found; install it or use 'xla_lse'")
  tmp = f"{path}.{os.getpid()}.tmp"
  proc = subprocess.run([compiler, *FLAGS, "-w", f"-I{jax.ffi.include_dir()}", f"-I{HERE}", str(source), "-o", tmp],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    fail(f"compiling {source.name} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}")
  os.replace(tmp, path)


def shared_library(source, fail):
  """``source`` (a ``.cc`` path) built if needed and loaded (``ctypes.CDLL``); ``fail(message)`` raises for a
  missing compiler or a failed build."""
  import fcntl  # pylint: disable=g-import-not-at-top  (POSIX: importing jaxwm elsewhere must not need it)
  import jaxlib  # pylint: disable=g-import-not-at-top
  source = pathlib.Path(source)
  text = source.read_bytes() + b"".join(h.read_bytes() for h in HEADERS)
  key = hashlib.sha256(text + jaxlib.__version__.encode() + " ".join(FLAGS).encode() +
                       host_cpu().encode()).hexdigest()
  cache = _cache_dir()
  path = cache / f"{source.stem}-{key[:16]}.so"
  with open(cache / ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not path.exists():
      _compile(source, path, fail)
  return ctypes.CDLL(str(path))


def register(lib, targets):
  """Registers ``{target name: symbol}`` of ``lib`` as XLA:CPU FFI targets."""
  for name, symbol in targets.items():
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")


def unavailable(library, loaded, reasons, lock, warning):
  """Why ``library()`` cannot be built or loaded here (no C++ compiler, a read-only cache, another OS), or None.
  Tried once: ``loaded`` and ``reasons`` are the caller's lists (the loaded library, the reason found), ``lock``
  its lock; the reason is logged once as a warning, ``warning % reason``."""
  with lock:
    if not reasons and not loaded:
      try:
        library()
      except Exception as e:  # pylint: disable=broad-except  (a missing compiler, ImportError, OSError, ...)
        reasons.append(f"{type(e).__name__}: {e}")
        logging.warning(warning, reasons[0])
  return reasons[0] if reasons else None


def _one_blas_thread(blas, impl):
  """Sets scipy's OpenBLAS to one thread (the kernels' units already run on every core; OpenBLAS threads inside
  them oversubscribe the cores, 2-3x slower on 2 cores). Process-wide: scipy's other BLAS calls run on one thread."""
  libs = sorted(pathlib.Path(blas.__file__).parents[2].glob("scipy.libs/*openblas*.so*"))
  for path in libs:
    lib = ctypes.CDLL(str(path))
    for symbol in ("scipy_openblas_set_num_threads", "openblas_set_num_threads"):
      if hasattr(lib, symbol):
        getattr(lib, symbol)(1)
        return
  logging.warning("%r: could not set scipy's BLAS to one thread (no OpenBLAS found in %s); the kernel may "
                  "oversubscribe the cores", impl, [str(p) for p in libs])


def scipy_sgemm(impl):
  """The address of the BLAS ``sgemm`` that scipy ships (Fortran interface), its BLAS set to one thread; ``impl``
  names the kernel in the warning when that fails. The kernels take it through their ``*_set_sgemm`` function."""
  import scipy.linalg.cython_blas as blas  # pylint: disable=g-import-not-at-top
  capsule = blas.__pyx_capi__["sgemm"]
  name = ctypes.pythonapi.PyCapsule_GetName
  name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
  pointer = ctypes.pythonapi.PyCapsule_GetPointer
  pointer.restype, pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
  _one_blas_thread(blas, impl)
  return pointer(capsule, name(capsule))


def threads():
  """OpenMP threads per kernel call: the cores this process may use, shared by its local devices, which may run
  their calls at the same time (8 devices faked on 2 cores: 1 thread each), or by the current mesh's devices
  (``jax.set_mesh``) where it has fewer."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  mesh = jax.sharding.get_abstract_mesh()
  devices = jax.local_device_count() if mesh.empty else min(mesh.size, jax.local_device_count())
  return max(1, cores // devices)
