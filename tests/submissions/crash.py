"""Kills its own process: the grader must report the row and carry on."""
import os


async def train(model):
    os._exit(3)
