"""The recall room (DESIGN §16)."""
