"""The contenders `make bench` compares serve-app with, one small module each.

models.py builds the three workload models from the project's own backends (so every
contender runs the same model code); contract.py is serve-app's HTTP contract for the
peers that speak it; offline.py is the no-server ceiling; naive.py, streamer.py
(service_streamer), mlpool_peer.py and bentoml_service.py are the peer servers.
"""
