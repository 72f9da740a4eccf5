"""Data: the procedural loop-closure scenes (the embedded dataset) and clip windows (``window.ClipWindow``);
training's loaders are in ``jaxwm.training.data``."""
