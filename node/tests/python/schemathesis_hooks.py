"""schemathesis hooks for deploy/schemathesis.sh (which
node/tests/http_schemathesis.rs runs).

A real client sends a fresh Idempotency-Key with each new request and the
same one only with a retry. A fuzzer draws the same keys ("0", "null", a
run of zeros) again and again for unrelated requests: Tally then rightly
answers a retry (the first answer, nothing applied) or a 422 (the key was
used for another request), which the checks read as valid data refused.
So every drawn key of a valid length (at most 128 bytes) is made unique:
it keeps as many of its drawn characters as fit before a 33-byte unique
suffix, and stays within 128 bytes. A longer key (drawn to test the limit)
is sent as drawn, and refused with 400.

A `%` drawn into a path parameter is sent as it is, unescaped, so the
server reads it as the start of an escape: a drawn 258-character key
"%40000..." reaches the node as the 256-character "@000..." and is rightly
accepted, which the checks read as invalid data accepted. Such a `%` is
sent as `x` instead: the same length, so the value is as valid or invalid
as drawn (a key's schema limits only its length).
"""

import uuid

import schemathesis

MAX_KEY_BYTES = 128
SUFFIX_BYTES = 1 + 32


def unique(value):
    """`value` with a unique suffix, at most MAX_KEY_BYTES of UTF-8."""
    kept = value.encode()[: MAX_KEY_BYTES - SUFFIX_BYTES].decode(errors="ignore")
    return f"{kept}-{uuid.uuid4().hex}"


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    """Runs before every request of every phase (the coverage phase's
    boundary values too, which `map_headers` does not see)."""
    for name, value in list((case.path_parameters or {}).items()):
        if isinstance(value, str) and "%" in value:
            case.path_parameters[name] = value.replace("%", "x")
    if not case.headers:
        return
    for name in list(case.headers):
        value = case.headers[name]
        if name.lower() == "idempotency-key" and isinstance(value, str) \
                and len(value.encode()) <= MAX_KEY_BYTES:
            case.headers[name] = unique(value)
