#!/usr/bin/env python3
"""A stand-in for Prometheus's /api/v1/query (the shape tests/support.py ScriptedPrometheus serves):
every query answers the number in VALUE_FILE (re-read on each request, so `echo 1 > FILE` flips it).
Usage: fake-prometheus.py PORT VALUE_FILE"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

port, value_file = int(sys.argv[1]), Path(sys.argv[2])


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if not self.path.startswith("/api/v1/query"):
            self.send_error(404)
            return
        value = value_file.read_text().strip()
        body = json.dumps({"status": "success", "data": {"resultType": "vector",
                           "result": [{"metric": {}, "value": [0, value]}]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
