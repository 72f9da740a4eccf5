"""Training: teacher-forcing layout, sharding, optimiser, data pipeline, checkpoints, loop."""
