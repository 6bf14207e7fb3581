"""The in-memory reference backends: the model every storage port is tested against."""
