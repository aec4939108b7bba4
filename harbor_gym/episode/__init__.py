"""harbor_gym.episode: the turn engine (SPEC §4-§11, §13, §14)."""
