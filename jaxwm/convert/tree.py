"""Nested-dict helpers the weight converters share: set and get a leaf by its key path."""


def set_path(tree, path, value):
  """``tree[path[0]][path[1]]... = value``, creating the dicts on the way."""
  for p in path[:-1]:
    tree = tree.setdefault(p, {})
  tree[path[-1]] = value


def get_path(tree, path):
  """``tree[path[0]][path[1]]...``."""
  for p in path:
    tree = tree[p]
  return tree
