"""Import layering, checked on the source (``ast``), so imports inside functions count too:

- ``jaxwm/ops`` holds references only: it imports nothing from ``pallas_kernels`` or ``xla_kernels``;
- ``xla_kernels`` imports no reference (``jaxwm.ops``): they are tested against them;
- ``jaxwm/sampling`` and ``jaxwm/cli/sample*.py`` (``sample.py``) import nothing from ``jaxwm.training``;
- ``pallas_kernels`` uses only public names of ``jaxwm`` (no ``_private`` import or attribute) and, like
  ``xla_kernels``, imports no reference: what it shares with one is an interface (``jaxwm/interfaces``);
- the layering of :data:`LAYERS`: training never imports evaluation or distillation (probes and samples are hooks
  the CLI passes) nor ``config_checks`` (the checks across blocks sit above the blocks), ``jaxwm/settings.py``
  (the config schema) imports nothing of ``jaxwm``, encodings never import models (both stand on
  ``jaxwm/layers.py``, which imports neither), models never import the converters or the encoder factories.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _package(path, root):
  """The package a file's relative imports start from (``a/b/c.py`` and ``a/b/__init__.py``: ``a.b``)."""
  return ".".join(pathlib.Path(path).resolve().relative_to(root).parent.parts)


def _dotted(node):
  """``a.b.c`` for a chain of attributes on a name, else None."""
  if isinstance(node, ast.Attribute):
    base = _dotted(node.value)
    return base and f"{base}.{node.attr}"
  return node.id if isinstance(node, ast.Name) else None


def _walk_imports(tree, path, root):
  """``(module, bound, referent)`` for every import anywhere in ``tree``: the module imported,
  the local name it binds (or None) and the dotted name that local name stands for."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        head = a.name.split(".")[0]
        yield a.name, a.asname or head, a.name if a.asname else head
    elif isinstance(node, ast.ImportFrom):
      mod = node.module or ""
      if node.level:  # relative: resolved against the file's package
        base = _package(path, root).split(".")
        mod = ".".join(base[:len(base) - node.level + 1] + ([mod] if mod else []))
      yield mod, None, None
      for a in node.names:
        yield f"{mod}.{a.name}", a.asname or a.name, f"{mod}.{a.name}"
    elif (isinstance(node, ast.Call) and _dotted(node.func) in ("importlib.import_module", "__import__")
          and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
      yield node.args[0].value, None, None


def _parse(path):
  return ast.parse(pathlib.Path(path).read_text(), filename=str(path))


def imported_modules(path, root=ROOT):
  """All module names imported anywhere in ``path`` (a file under ``root``): ``import a.b``
  gives ``a.b``; ``from x import y`` gives ``x`` and ``x.y`` (``y`` a module or a name in ``x``)."""
  return {mod for mod, _, _ in _walk_imports(_parse(path), path, root)}


def _is_private(name):
  return any(p.startswith("_") and not p.endswith("__") for p in name.split("."))


def private_uses(path, package, root=ROOT):
  """Underscore-prefixed names of ``package`` that ``path`` imports or reaches as attributes of
  an imported name (``ref._helper`` after ``from jaxwm.ops import delta_rule as ref``)."""
  within = lambda m: m == package or m.startswith(package + ".")
  tree = _parse(path)
  found, aliases = set(), {}
  for mod, bound, referent in _walk_imports(tree, path, root):
    if within(mod) and _is_private(mod):
      found.add(mod)
    if bound and within(referent):
      aliases[bound] = referent
  for node in ast.walk(tree):
    dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
    head = dotted and dotted.split(".")[0]
    if head in aliases and _is_private(aliases[head] + dotted[len(head):]):
      found.add(aliases[head] + dotted[len(head):])
  return sorted(found)


def _files(folder):
  return sorted((ROOT / folder).rglob("*.py"))


def _ids(files):
  return [str(f.relative_to(ROOT)) for f in files]


def _hits(path, prefix):
  return sorted(m for m in imported_modules(path) if m == prefix or m.startswith(prefix + "."))


OPS, SAMPLING, KERNELS = _files("jaxwm/ops"), _files("jaxwm/sampling"), _files("pallas_kernels")
XLA_KERNELS = _files("xla_kernels")
SAMPLING += sorted((ROOT / "jaxwm" / "cli").glob("sample*.py"))  # sample.py's body and its helpers


@pytest.mark.parametrize("path", OPS, ids=_ids(OPS))
def test_references_import_no_kernel(path):
  assert not _hits(path, "pallas_kernels") and not _hits(path, "xla_kernels")


@pytest.mark.parametrize("path", XLA_KERNELS, ids=_ids(XLA_KERNELS))
def test_xla_kernels_import_no_reference(path):
  assert not _hits(path, "jaxwm.ops") and not private_uses(path, "jaxwm")


@pytest.mark.parametrize("path", SAMPLING, ids=_ids(SAMPLING))
def test_sampling_does_not_import_training(path):
  assert not _hits(path, "jaxwm.training")


@pytest.mark.parametrize("path", KERNELS, ids=_ids(KERNELS))
def test_kernels_use_only_public_jaxwm_names(path):
  assert not private_uses(path, "jaxwm")


@pytest.mark.parametrize("path", KERNELS, ids=_ids(KERNELS))
def test_pallas_kernels_import_no_reference(path):
  """Checks and preparation shared with a reference live in ``jaxwm.interfaces``, never in ``jaxwm.ops``."""
  assert not _hits(path, "jaxwm.ops")


# (files, forbidden package): no file under the first imports anything of the second.
LAYERS = (("jaxwm/training", "jaxwm.evaluation"), ("jaxwm/training", "jaxwm.distill"),
          ("jaxwm/training", "jaxwm.config_checks"), ("jaxwm/settings.py", "jaxwm"), ("jaxwm/encodings", "jaxwm.models"),
          ("jaxwm/layers.py", "jaxwm.models"), ("jaxwm/layers.py", "jaxwm.encodings"),
          ("jaxwm/models", "jaxwm.convert"), ("jaxwm/models", "jaxwm.encoders"))
_LAYER_CASES = [(str(f.relative_to(ROOT)), banned) for where, banned in LAYERS
                for f in ([ROOT / where] if where.endswith(".py") else _files(where))]


@pytest.mark.parametrize("path,banned", _LAYER_CASES, ids=[f"{p}-{b}" for p, b in _LAYER_CASES])
def test_layering(path, banned):
  assert not _hits(ROOT / path, banned)


def test_the_checks_see_lazy_relative_and_private_imports(tmp_path):
  (tmp_path / "pkg").mkdir()
  src = tmp_path / "pkg" / "mod.py"
  src.write_text("import os.path as osp\n"
                 "from jaxwm.ops import delta_rule as ref\n"
                 "import jaxwm.ops.frame_sparse\n"
                 "def f():\n"
                 "  from pallas_kernels import delta_rule\n"
                 "  from . import sibling\n"
                 "  from jaxwm.training.loop import _private\n"
                 "  return ref._prepare, ref.prepare_inputs, jaxwm.ops.frame_sparse._top_indices, jaxwm.__name__\n")
  assert imported_modules(src, root=tmp_path) == {
      "os.path", "jaxwm.ops", "jaxwm.ops.delta_rule", "jaxwm.ops.frame_sparse", "pallas_kernels",
      "pallas_kernels.delta_rule", "pkg", "pkg.sibling", "jaxwm.training.loop", "jaxwm.training.loop._private"}
  assert private_uses(src, "jaxwm", root=tmp_path) == [
      "jaxwm.ops.delta_rule._prepare", "jaxwm.ops.frame_sparse._top_indices", "jaxwm.training.loop._private"]
