"""Flow-matching diffusion (DESIGN §9)."""
