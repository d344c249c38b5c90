"""The summary room (DESIGN §16)."""
