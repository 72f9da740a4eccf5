"""Data: the procedural loop-closure scenes (the embedded dataset) and loaders."""
