"""Never returns: a real infinite loop (virtual time cannot see it; the wall-clock timeout must)."""


async def train(model):
    while True:
        pass
