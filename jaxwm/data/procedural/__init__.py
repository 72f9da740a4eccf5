"""Procedural loop-closure scenes: the embedded dataset (ray-cast rooms with ground truth).

``python -m jaxwm.data.procedural --preview loop.gif`` writes a GIF of a loop.
"""

from jaxwm.data.procedural.clips import EVAL_LOOPS, ProceduralClips, make_clip, make_trajectory, pinhole_intrinsics
from jaxwm.data.procedural.render import render
from jaxwm.data.procedural.scene import Scene, make_scene
from jaxwm.data.procedural.trajectories import AXIS_COMBOS, FAMILIES, MAGNITUDES_DEG, WALKS
