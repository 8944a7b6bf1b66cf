"""Example model modules for `models:` in the Serve config (see the README, "Bring your own model")."""
