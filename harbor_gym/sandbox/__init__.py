"""harbor_gym.sandbox."""
