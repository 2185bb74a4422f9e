"""Allocates far more real memory than the worker's address-space limit allows."""


async def train(model, *, gigabytes: int = 64):
    hoard = bytearray(gigabytes * 2**30)
    return hoard
