"""harbor_gym.vector."""
