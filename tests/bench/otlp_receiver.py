"""The bench's OTLP/HTTP collector (tests/bench/otlp.sh): answers 200 to
every POST after reading its body, and prints a running count. It keeps
nothing: what costs sekali to export, not a collector's work, is measured."""
import http.server, sys, threading
n = {"req": 0, "bytes": 0}
lock = threading.Lock()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with lock:
            n["req"] += 1; n["bytes"] += len(body)
            if n["req"] % 50 == 0:
                print(n, flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
s.serve_forever()
