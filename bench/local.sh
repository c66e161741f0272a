# Sourced by the scripts that run servers on 127.0.0.1 (bench/webhook-load.sh,
# bench/webhook-callgrind.sh): a port and a certificate for them.

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# self_signed DIR: DIR/tls.key and DIR/tls.crt, a P-256 certificate for 127.0.0.1, valid a day.
self_signed() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
        -keyout "$1/tls.key" -out "$1/tls.crt" -subj "/CN=127.0.0.1" \
        -addext "subjectAltName=IP:127.0.0.1" 2>/dev/null
}
