"""harbor_gym.agents."""
