"""Frame-selection maps in the manner of ViewRope Fig. 3: query frame down, history (key) frame across.

Selected history frames are red, the own chunk (always attended) blue, frames outside the
history dark grey; other candidates are light grey, or green by block relevance (Eq. 9,
normalised per row, darker = more relevant) when ``scores`` are given.
"""

import matplotlib as mpl
from matplotlib.patches import Patch
import numpy as np

from jaxwm.evaluation import plots

SELECTED, LOCAL, OUTSIDE, CANDIDATE = (230, 50, 40), (60, 110, 230), (40, 40, 40), (235, 235, 235)
RELEVANCE = "Greens"  # colour map of ``scores``


def selection_image(selected, num_key_frames, *, scores=None, local=None, history=None, cell=8):
  """Renders one selection map as pixels.

  Args:
    selected: ``[Fq, k]`` int selected key frames per query frame (-1 pads).
    num_key_frames: ``Fk``.
    scores: optional ``[Fq, Fk]`` relevance, shown normalised per row.
    local: optional ``[Fq, C]`` int own-chunk frames (-1 pads).
    history: optional ``[Fq, Fk]`` bool candidates; others are drawn dark.
    cell: pixels per cell.

  Returns:
    ``[Fq*cell, Fk*cell, 3]`` uint8.
  """
  selected = np.asarray(selected)
  img = np.full((selected.shape[0], num_key_frames, 3), CANDIDATE, np.float32)
  if scores is not None:
    s = np.asarray(scores, np.float32)
    lo, hi = s.min(axis=1, keepdims=True), s.max(axis=1, keepdims=True)
    img[:] = 255.0 * mpl.colormaps[RELEVANCE]((s - lo) / np.maximum(hi - lo, 1e-12))[..., :3]
  if history is not None:
    img[~np.asarray(history, bool)] = OUTSIDE
  for rows, colour in ((local, LOCAL), (selected, SELECTED)):
    for i, row in enumerate(np.asarray(rows) if rows is not None else ()):
      img[i, row[row >= 0]] = colour
  return np.repeat(np.repeat(img.astype(np.uint8), cell, axis=0), cell, axis=1)


def _ticks(axis, n, labels):
  pos = list(range(0, n, max(1, int(np.ceil(n / 20)))))
  axis.set_ticks(pos, [str(labels[i]) if labels is not None else str(i) for i in pos])


def _fraction(selected, num_key_frames):
  """``[L, Fq, k]`` -> ``[Fq, Fk]`` fraction of layers selecting each cell."""
  frac = np.zeros(selected.shape[1:2] + (num_key_frames,))
  for sel in selected:
    for i, row in enumerate(sel):
      frac[i, np.unique(row[row >= 0])] += 1.0 / len(selected)
  return frac


def save_selection_maps(path, selected, num_key_frames, *, key_labels=None, query_labels=None, layers=None,
                        title="frame selection", cell=8, **kwargs):
  """Saves the selection maps of ``selected [L, Fq, k]`` (e.g. ``entries.selected[:, b]``) as a PNG.

  One ``[Fq, Fk]`` panel per layer; with ``Fq == 1`` one panel with the layers as rows; with
  ``layers="mean"`` (default when ``L > 8``) one panel of the fraction of layers selecting each cell.
  The short side is at least 600 pixels.

  Args:
    path: output PNG (RGB).
    selected: ``[L, Fq, k]`` int (-1 pads).
    num_key_frames: ``Fk``.
    key_labels, query_labels: optional tick labels (``Fk`` / ``Fq`` long), e.g. absolute frame indices.
    layers: ``"each"`` or ``"mean"``.
    title: figure title.
    cell: minimum pixels per cell.
    **kwargs: ``scores [Fq, Fk]``, ``local [Fq, C]``, ``history [Fq, Fk]`` of ``selection_image`` (all layers).
  """
  selected = np.asarray(selected)
  nl, fq = selected.shape[:2]
  mean = (layers or ("mean" if nl > 8 else "each")) == "mean"
  if mean:  # (name, image, y labels, y axis label)
    base = selection_image(np.full((fq, 1), -1), num_key_frames, cell=1,
                           **{k: v for k, v in kwargs.items() if k != "scores"})
    panels = [(f"mean over {nl} layers", base, query_labels, "query frame")]
  elif fq == 1:
    kw = {k: None if v is None else np.repeat(np.asarray(v)[:1], nl, 0) for k, v in kwargs.items()}
    panels = [("", selection_image(selected[:, 0], num_key_frames, cell=1, **kw), [f"layer {l}" for l in range(nl)],
               "layer" + (f" (query frame {query_labels[0]})" if query_labels is not None else ""))]
  else:
    panels = [(f"layer {l}", selection_image(selected[l], num_key_frames, cell=1, **kwargs), query_labels,
               "query frame") for l in range(nl)]
  rows = panels[0][1].shape[0]
  ncol = min(len(panels), 4)
  nrow = -(-len(panels) // ncol)
  width = max(600, ncol * max(320, 90 + num_key_frames * cell) + 200)
  fig = plots.figure((width, max(600, nrow * max(220, 70 + rows * cell) + 110)))
  axes = fig.subplots(nrow, ncol, squeeze=False).ravel()
  for ax, (name, img, ylabels, ylabel) in zip(axes, panels):
    ax.imshow(img, interpolation="nearest", aspect="auto")
    if mean:
      frac = _fraction(selected, num_key_frames)
      im = ax.imshow(np.ma.masked_equal(frac, 0.0), cmap="Reds", vmin=0, vmax=1, interpolation="nearest",
                     aspect="auto")
      fig.colorbar(im, ax=ax, label="fraction of layers selecting")
    _ticks(ax.xaxis, num_key_frames, key_labels)
    _ticks(ax.yaxis, rows, ylabels)
    if max(rows, num_key_frames) <= 64:  # thin cell borders
      ax.set_xticks(np.arange(num_key_frames + 1) - 0.5, minor=True)
      ax.set_yticks(np.arange(rows + 1) - 0.5, minor=True)
      ax.grid(which="minor", color="white", lw=0.6)
      ax.tick_params(which="minor", length=0)
    ax.set(xlabel="history (key) frame", ylabel=ylabel)
    ax.set_title(name, fontsize=10)
  for ax in axes[len(panels):]:
    ax.set_axis_off()
  legend = [(SELECTED, "selected", not mean), (LOCAL, "own chunk (always)", kwargs.get("local") is not None),
            (OUTSIDE, "not in history", kwargs.get("history") is not None),
            (CANDIDATE, "candidate, not selected", kwargs.get("scores") is None)]
  handles = [Patch(facecolor=np.array(c) / 255, edgecolor="0.5", label=t) for c, t, used in legend if used]
  fig.legend(handles=handles, loc="outside lower center", ncol=len(handles) if width >= 900 else 2, fontsize=9)
  if kwargs.get("scores") is not None and not mean:
    fig.colorbar(mpl.cm.ScalarMappable(mpl.colors.Normalize(0, 1), RELEVANCE), ax=list(axes[:len(panels)]),
                 label="relevance (Eq. 9) / row range, candidates")
  fig.suptitle(title)
  return plots.save(fig, path)
