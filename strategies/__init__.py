"""Built-in strategies: one `async def train(model, **options)` per module."""
