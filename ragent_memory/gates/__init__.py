"""The gates room (DESIGN §16)."""
