"""Deployment tooling of serve-app: the Serve config profiles and their renderer."""
