"""harbor_gym.wrappers."""
