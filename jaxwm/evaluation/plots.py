"""Small PIL figures (no plotting library needed): metric-against-magnitude line plots and heat maps."""

import numpy as np
from PIL import Image, ImageDraw

COLOURS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))


def line_plot(path, series, *, xlabel="", ylabel="", title="", size=(560, 360)):
  """Saves a line plot with 95% error bars.

  Args:
    path: output PNG.
    series: ``{name: (xs, means, half_widths)}``, half_widths may be None.
    xlabel, ylabel, title: axis labels and title.
  """
  w, h = size
  left, right, top, bottom = 64, 150, 30, 40
  img = Image.new("RGB", size, "white")
  d = ImageDraw.Draw(img)
  xs_all = np.concatenate([np.asarray(s[0], float) for s in series.values()])
  lo_hi = [np.asarray(s[1], float) - np.nan_to_num(np.asarray(s[2] if s[2] is not None else 0, float))
           for s in series.values()] + [np.asarray(s[1], float) + np.nan_to_num(
               np.asarray(s[2] if s[2] is not None else 0, float)) for s in series.values()]
  ys_all = np.concatenate(lo_hi)
  ys_all = ys_all[np.isfinite(ys_all)]
  x0, x1 = float(xs_all.min()), float(xs_all.max())
  y0, y1 = (float(ys_all.min()), float(ys_all.max())) if ys_all.size else (0.0, 1.0)
  if x1 == x0:
    x1 = x0 + 1
  pad = 0.05 * (y1 - y0 or 1.0)
  y0, y1 = y0 - pad, y1 + pad

  def px(x, y):
    return (left + (x - x0) / (x1 - x0) * (w - left - right), top + (y1 - y) / (y1 - y0) * (h - top - bottom))

  d.rectangle([left, top, w - right, h - bottom], outline="black")
  for i in range(5):
    yv = y0 + (y1 - y0) * i / 4
    _, yy = px(x0, yv)
    d.line([left - 4, yy, left, yy], fill="black")
    d.text((4, yy - 6), f"{yv:.3g}", fill="black")
  for xv in sorted(set(xs_all.tolist())):
    xx, _ = px(xv, y0)
    d.line([xx, h - bottom, xx, h - bottom + 4], fill="black")
    d.text((xx - 8, h - bottom + 6), f"{xv:g}", fill="black")
  d.text((left, h - 14), xlabel, fill="black")
  d.text((4, 4), f"{title}    ({ylabel})" if title else ylabel, fill="black")
  for i, (name, (xs, ys, err)) in enumerate(series.items()):
    c = COLOURS[i % len(COLOURS)]
    pts = [px(x, y) for x, y in zip(xs, ys) if np.isfinite(y)]
    if len(pts) > 1:
      d.line(pts, fill=c, width=2)
    for j, (x, y) in enumerate(zip(xs, ys)):
      if not np.isfinite(y):
        continue
      cx, cy = px(x, y)
      d.ellipse([cx - 3, cy - 3, cx + 3, cy + 3], fill=c)
      if err is not None and np.isfinite(err[j]):
        _, ya = px(x, y - err[j])
        _, yb = px(x, y + err[j])
        d.line([cx, ya, cx, yb], fill=c)
    d.text((w - right + 8, top + 14 * i), name, fill=c)
  img.save(path)
  return path


def heat_map(path, values, *, row_labels=(), col_labels=(), cell=18, title=""):
  """Saves ``values [R, C]`` (>= 0, NaN drawn grey) as a white-to-dark-red heat map, normalised per row."""
  v = np.asarray(values, float)
  r, c = v.shape
  left, top = 70, 22 + (14 if title else 0)
  img = Image.new("RGB", (left + c * cell + 10, top + r * cell + 10), "white")
  d = ImageDraw.Draw(img)
  if title:
    d.text((4, 2), title, fill="black")
  for j, lab in enumerate(col_labels):
    d.text((left + j * cell + 3, top - 14), str(lab), fill="black")
  for i in range(r):
    if i < len(row_labels):
      d.text((4, top + i * cell + 3), str(row_labels[i]), fill="black")
    row = v[i]
    m = np.nanmax(row) if np.isfinite(row).any() else 1.0
    for j in range(c):
      x = row[j]
      col = (180, 180, 180) if not np.isfinite(x) else tuple(int(255 - (255 - t) * x / max(m, 1e-12))
                                                               for t in (120, 20, 20))
      d.rectangle([left + j * cell, top + i * cell, left + (j + 1) * cell - 1, top + (i + 1) * cell - 1], fill=col)
  img.save(path)
  return path
