"""Small shared utilities (media writing)."""
