"""Parent attack: 1.5 GB written to standard output (a parent that buffers it in memory runs out)."""
TWIN = "honest"  # the honest strategy this cheat must not rank above
import os


async def train(model):
    chunk = b"x" * 2**20
    for _ in range(1536):
        os.write(1, chunk)
