"""harbor_gym.task."""
