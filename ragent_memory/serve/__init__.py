"""The serve room (DESIGN §16)."""
