"""schemathesis hooks for node/tests/http_schemathesis.rs.

A real client sends a fresh Idempotency-Key with each new request and the
same one only with a retry. A fuzzer draws short keys ("0", "null") again
and again for unrelated requests: Tally then rightly answers a retry (the
first answer, nothing applied) or a 422 (the key was used for another
request), which the checks read as a bug. So a drawn key that leaves room
gets a unique suffix: its drawn characters are still sent (and checked as
gRPC checks them), longer ones are sent as drawn.
"""

import uuid

import schemathesis

MAX_KEY_BYTES = 128
SUFFIX_BYTES = 1 + 32


@schemathesis.hook
def map_headers(ctx, headers):
    if not headers:
        return headers
    for name in list(headers):
        value = headers[name]
        if name.lower() == "idempotency-key" and isinstance(value, str) \
                and len(value.encode()) + SUFFIX_BYTES <= MAX_KEY_BYTES:
            headers[name] = f"{value}-{uuid.uuid4().hex}"
    return headers
