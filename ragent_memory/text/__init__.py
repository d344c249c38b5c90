"""The text room (DESIGN §16)."""
