"""Example model modules for `models:` in the Serve config (docs/your-own-model.md)."""
