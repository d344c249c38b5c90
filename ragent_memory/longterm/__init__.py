"""The longterm room (DESIGN §16)."""
