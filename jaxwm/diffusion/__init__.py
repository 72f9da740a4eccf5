"""Flow-matching diffusion (docs/design.md §9)."""
