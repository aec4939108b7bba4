"""harbor_gym.episode."""
