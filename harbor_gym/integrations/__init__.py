"""Trainer adapters: thin modules turning `harbor_gym.training` records into what one trainer consumes.

Each adapter imports its trainer lazily (install the ``train`` extra); importing this package needs none.
"""

__all__: list[str] = []
