"""service_streamer contender: its ThreadedStreamer in front of the model, in Flask, as its README shows.

    python -m bench.peers.streamer --workload embeddings --port 9561

Each request's texts go to `streamer.predict`, which batches them with other
requests' texts (same batch cap and wait as serve-app's config) in one model thread.
"""

from __future__ import annotations

from flask import Flask, jsonify, request

from bench.peers import contract
from bench.peers.models import WORKLOADS, load_model, peer_batching
from bench.peers.server_args import parse_server_args


def create_app(workload: str) -> Flask:
    from service_streamer import ThreadedStreamer

    batch_size, wait_s = peer_batching(workload)
    streamer = ThreadedStreamer(load_model(workload), batch_size=batch_size, max_latency=wait_s)
    app = Flask(__name__)

    @app.post(WORKLOADS[workload].route)
    def predict():
        body = request.get_json()
        outputs = streamer.predict(contract.texts_of(workload, body))
        return jsonify(contract.response_of(workload, body, outputs))

    @app.get("/readyz")
    def readyz():
        return jsonify({"status": "ready"})

    return app


def main() -> None:
    args = parse_server_args(__doc__)
    # The README's server: Flask's own, threaded (the default since Flask 1.0).
    create_app(args.workload).run(host="127.0.0.1", port=args.port, debug=False, threaded=True)


if __name__ == "__main__":
    main()
