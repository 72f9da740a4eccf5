"""Training: teacher-forcing layout, sharding, optimiser, data pipeline, loop (checkpoints: ``jaxwm.checkpoint``)."""
