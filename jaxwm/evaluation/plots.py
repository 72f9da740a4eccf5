"""Matplotlib (Agg canvas, no pyplot state) figures: metric-against-magnitude plots and heat maps."""

import matplotlib as mpl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
import numpy as np
from PIL import Image

DPI = 100


def figure(size_px):
  """A ``Figure`` of ``size_px = (width, height)`` pixels with constrained layout."""
  return Figure(figsize=(size_px[0] / DPI, size_px[1] / DPI), dpi=DPI, layout="constrained")


def save(fig, path):
  """Renders ``fig`` and writes an RGB PNG of exactly its pixel size; returns ``path``."""
  canvas = FigureCanvasAgg(fig)
  canvas.draw()
  Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3]).save(path)
  return path


def line_plot(path, series, *, xlabel="", ylabel="", title="", size=(560, 360)):
  """Saves a line plot, one line per series, with 95% confidence error bars.

  Args:
    path: output PNG (RGB, ``size`` pixels).
    series: ``{name: (xs [N], means [N], half_widths [N] or None)}``; NaN half-widths draw no bar.
    xlabel, ylabel, title: axis labels and title.
    size: ``(width, height)`` in pixels.
  """
  fig = figure(size)
  ax = fig.add_subplot()
  xs_all = sorted({float(x) for s in series.values() for x in s[0]})
  span = (xs_all[-1] - xs_all[0]) or 1.0
  n = len(series)
  for i, (name, (xs, ys, err)) in enumerate(series.items()):
    dx = 0.012 * span * (i - (n - 1) / 2)  # dodge so that overlapping bars stay apart
    yerr = None if err is None else np.asarray(err, float)
    ax.errorbar(np.asarray(xs, float) + dx, np.asarray(ys, float), yerr=yerr, marker="o", ms=4, lw=1.5,
                capsize=3, label=str(name))
  ax.set_xticks(xs_all, [f"{x:g}" for x in xs_all])
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.grid(alpha=0.3)
  outside = n > 4
  ax.legend(title="setting (bars: 95% CI)", fontsize=8, title_fontsize=8, framealpha=0.85,
            **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if outside else {"loc": "best"}))
  return save(fig, path)


def heat_map(path, values, *, row_labels=(), col_labels=(), cell=18, title="", xlabel="", ylabel="",
             cbar_label="value / row max", nan_label="n/a"):
  """Saves ``values [R, C]`` (>= 0) as a heat map normalised per row; NaN cells are grey.

  Args:
    path: output PNG.
    values: ``[R, C]``.
    row_labels, col_labels: tick labels (``R`` and ``C`` long, or empty for indices).
    cell: minimum pixels per cell; the figure is at least 640x400 pixels.
    title, xlabel, ylabel, cbar_label: text.
    nan_label: what grey (NaN) cells mean, added to the colour bar label.
  """
  v = np.asarray(values, float)
  r, c = v.shape
  with np.errstate(invalid="ignore", divide="ignore"):
    m = np.nanmax(np.where(np.isfinite(v), v, -np.inf), axis=1, keepdims=True)
    v = v / np.where(m > 0, m, 1.0)
  fig = figure((max(640, 180 + c * cell), max(400, 120 + r * cell)))
  ax = fig.add_subplot()
  cmap = mpl.colormaps["Reds"].with_extremes(bad="0.7")
  im = ax.imshow(np.ma.masked_invalid(v), cmap=cmap, vmin=0, vmax=1, aspect="auto", interpolation="nearest")
  for axis, labels, n in ((ax.xaxis, col_labels, c), (ax.yaxis, row_labels, r)):
    if len(labels):
      step = max(1, int(np.ceil(n / 24)))
      axis.set_ticks(range(0, n, step), [str(labels[i]) for i in range(0, n, step)])
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  fig.colorbar(im, ax=ax, label=cbar_label + (f"\n(grey: {nan_label})" if np.isnan(v).any() else ""))
  return save(fig, path)
