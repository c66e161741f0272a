"""Training load for the profile-guided release build (build/release.sh).

Posts admission reviews to a server over TLS keep-alive, from a few connections at once, so
that the instrumented binary records the paths a webhook under load takes: mostly the typical
review of the load benchmark (every template applies), and some that only one template selects
or none does. Usage: pgo-train.py PORT CERT REQUESTS [--typical-only]
"""

import copy
import http.client
import json
import ssl
import sys
import threading

CONNECTIONS = 4


def reviews(typical_only):
    with open("bench/fixtures/typical-pod-review.json", "rb") as f:
        typical = f.read()
    if typical_only:
        return [typical]
    review = json.loads(typical)
    one = copy.deepcopy(review)
    one["request"]["object"]["metadata"]["labels"]["app.kubernetes.io/part-of"] = "checkout"
    none = copy.deepcopy(review)
    del none["request"]["object"]["metadata"]["labels"]["app.kubernetes.io/part-of"]
    variants = [json.dumps(one).encode(), json.dumps(none).encode()]
    # Eight typical reviews for each of the others.
    return [typical] * 8 + variants


def drive(port, context, bodies, count, failures, answered):
    try:
        connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        for n in range(count):
            connection.request(
                "POST", "/mutate", body=bodies[n % len(bodies)],
                headers={"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            answer = response.read()
            if response.status != 200 or b'"allowed":true' not in answer:
                failures.append(f"HTTP {response.status}: {answer[:200]!r}")
            else:
                answered.append(1)
        connection.close()
    except Exception as error:  # noqa: BLE001 - any failure of a thread fails the training
        failures.append(repr(error))


def main():
    port, cert, requests = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    bodies = reviews("--typical-only" in sys.argv[4:])
    context = ssl.create_default_context(cafile=cert)
    failures, answered = [], []
    each = requests // CONNECTIONS
    threads = [
        threading.Thread(target=drive, args=(port, context, bodies, each, failures, answered))
        for _ in range(CONNECTIONS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures or len(answered) != each * CONNECTIONS:
        sys.exit(f"pgo-train: {len(answered)} of {each * CONNECTIONS} answered; failures: {sorted(set(failures))[:5]}")


if __name__ == "__main__":
    main()
