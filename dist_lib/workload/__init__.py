"""What is trained: a transformer's shape and the presets (`transformer`)."""
