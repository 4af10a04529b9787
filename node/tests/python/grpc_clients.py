#!/usr/bin/env python3
"""What the stock Python gRPC clients see from a real tally-node.

Issue 10, items 13 and 14, checked with the clients the issue names:
grpcio-reflection (which speaks only grpc.reflection.v1alpha) must list the
tally services, grpcio-health-checking must report SERVING for "" and for
every tally service, and raw bytes sent with grpcio's identity serializers
must get INVALID_ARGUMENT when malformed and RESOURCE_EXHAUSTED when over the
node's 16 MiB limit.

Usage: grpc_clients.py HOST:PORT  (a node with no --auth-tokens)
Exits 0 when every check passes; otherwise prints each failure and exits 1.
Run by node/tests/python_clients.rs.
"""

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

TALLY_SERVICES = ["tally.v1.Counters", "tally.v1.Admin", "tally.v1.Replication"]
DEADLINE = 10.0
failures = []


def check(ok, message):
    print(("ok   " if ok else "FAIL ") + message, flush=True)
    if not ok:
        failures.append(message)


def listed_services(channel):
    """The service names from a v1alpha ListServices call."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    answers = list(stub.ServerReflectionInfo(iter([request]), timeout=DEADLINE))
    if len(answers) != 1:
        raise RuntimeError(f"expected one reflection answer, got {len(answers)}")
    answer = answers[0]
    if answer.HasField("error_response"):
        raise RuntimeError(f"reflection error: {answer.error_response}")
    return [service.name for service in answer.list_services_response.service]


def raw_add(channel, body):
    """Sends `body` as the AddRequest's bytes; returns (code, details)."""
    add = channel.unary_unary(
        "/tally.v1.Counters/Add",
        request_serializer=None,
        response_deserializer=None,
    )
    try:
        add(body, timeout=DEADLINE)
    except grpc.RpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, "answered"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: grpc_clients.py HOST:PORT")
    target = sys.argv[1]
    # No client-side send limit, so an oversized message reaches the node and
    # the code checked below is the node's, not grpcio's own.
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(target, options=options) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=DEADLINE)
        except grpc.FutureTimeoutError:
            sys.exit(f"FAIL cannot connect to the node at {target} within {DEADLINE}s")

        # Item 14: reflection over v1alpha.
        try:
            services = listed_services(channel)
            check(True, f"grpcio-reflection (v1alpha) lists {services}")
        except grpc.RpcError as error:
            services = []
            check(False, f"grpcio-reflection (v1alpha) ListServices: "
                         f"{error.code()} {error.details()}")
        except RuntimeError as error:
            services = []
            check(False, f"grpcio-reflection (v1alpha) ListServices: {error}")
        for name in TALLY_SERVICES:
            check(name in services, f"reflection lists {name}")

        # Item 14: health for the server and for every tally service listed
        # (and the three expected ones, even if reflection failed).
        health = health_pb2_grpc.HealthStub(channel)
        to_check = [""] + sorted(set(TALLY_SERVICES)
                                 | {s for s in services if s.startswith("tally.")})
        for name in to_check:
            try:
                answer = health.Check(health_pb2.HealthCheckRequest(service=name),
                                      timeout=DEADLINE)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
                check(answer.status == health_pb2.HealthCheckResponse.SERVING,
                      f"health of {name!r} is SERVING (got {status})")
            except grpc.RpcError as error:
                check(False, f"health of {name!r} is SERVING (got {error.code()} "
                             f"{error.details()})")

        # Item 13: malformed bytes. AddRequest field 3 (idempotency_key, a
        # string) holding bytes that are not UTF-8, then a field that claims
        # 16 bytes and has 1.
        for what, body in [("invalid UTF-8 in a string", b"\x1a\x02\xff\xfe"),
                           ("a truncated message", b"\x0a\x10k")]:
            code, details = raw_add(channel, body)
            check(code == grpc.StatusCode.INVALID_ARGUMENT,
                  f"{what} gets INVALID_ARGUMENT (got {code}: {details})")

        # Item 13: over the node's 16 MiB limit.
        code, details = raw_add(channel, bytes(17 << 20))
        check(code == grpc.StatusCode.RESOURCE_EXHAUSTED,
              f"a 17 MiB message gets RESOURCE_EXHAUSTED (got {code}: {details})")

    if failures:
        print(f"\n{len(failures)} check(s) failed against {target}:", flush=True)
        for failure in failures:
            print(f"  - {failure}", flush=True)
        sys.exit(1)
    print(f"\nall checks passed against {target}", flush=True)


if __name__ == "__main__":
    main()
