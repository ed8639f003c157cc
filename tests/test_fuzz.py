"""Fuzzing in the suite, bounded to seconds: the request decoder with hypothesis, and
a live RPC server with the mutation fuzzer of tests/fuzzing.py (scripts/fuzz runs
the same for a million inputs or more).

Nothing a peer without the token sends may raise anything but a framing error, run a
tool, hang a connection, or leave bytes counted against the run's buffer cap.
"""

from __future__ import annotations

import random

import msgpack
import pytest
from fuzzing import (
    SEEDS,
    TOKEN,
    RecordingHandler,
    ask_live,
    check_reader,
    frame,
    live_server,
    new_server,
    run,
    stream,
    valid_request,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_sandbox.rpc.errors import FrameError
from hermes_sandbox.rpc.server import RequestReader

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.text(max_size=8) | st.integers(-(2**63), 2**63 - 1), children, max_size=5
        )
    ),
    max_leaves=30,
)
requests = st.fixed_dictionaries(
    {},
    optional={
        "id": values | st.integers(0, 2**63),
        "tool": values | st.text(min_size=1, max_size=30),
        "args": values | st.dictionaries(st.text(max_size=8), values, max_size=5),
        "token": values | st.sampled_from(["wrong", TOKEN[:-1]]),
    },
)


@FAST
@given(st.binary(max_size=300), st.randoms(use_true_random=False))
def test_random_bytes_never_get_past_the_decoder(data: bytes, rng: random.Random) -> None:
    check_reader(new_server(), data, rng)


@FAST
@given(requests, st.randoms(use_true_random=False))
def test_requests_without_the_token_are_refused(
    message: dict[str, object], rng: random.Random
) -> None:
    body = msgpack.packb(message, use_bin_type=True)
    check_reader(new_server(), frame(body), rng)


@FAST
@given(st.dictionaries(st.text(max_size=8), values, max_size=6))
def test_requests_with_the_token_decode_their_args_exactly(args: dict[str, object]) -> None:
    body = msgpack.packb({"id": 5, "tool": "t", "args": args, "token": TOKEN})
    handler = RecordingHandler()  # answers now: the reader hands back its reply
    (item,) = RequestReader(new_server(handler)).feed(frame(body))
    assert item == {"id": 5, "result": '{"ok": true}'}
    assert handler.calls == [("t", msgpack.unpackb(msgpack.packb(args), strict_map_key=False))]


@FAST
@given(st.integers(0, len(SEEDS) - 1), st.randoms(use_true_random=False))
def test_mutated_frames_never_get_past_the_decoder(index: int, rng: random.Random) -> None:
    from fuzzing import mutate

    check_reader(new_server(), frame(mutate(rng, SEEDS[index])), rng)


def test_ext_types_in_args_are_a_framing_error() -> None:
    body = b"\x84\xa2id\x01\xa4tool\xa1t\xa5token" + msgpack.packb(TOKEN)
    body += b"\xa4args\x81\xa1k\xd6\xff\0\0\0\1"
    with pytest.raises(FrameError, match="args"):
        RequestReader(new_server()).feed(frame(body))


@pytest.mark.timeout(60)
def test_a_live_server_survives_fuzzed_connections() -> None:
    """A few hundred fuzzed streams over a real Unix socket: every connection is
    answered and closed (none hangs), no tool runs, and a valid call still works."""
    rng = random.Random(11)
    handler = RecordingHandler()
    with live_server(handler) as path:
        for _ in range(300):
            for reply in ask_live(path, stream(rng)):
                assert "error" in reply, reply
        (reply,) = ask_live(path, valid_request(3))
    assert reply["id"] == 3 and "result" in reply
    assert handler.calls == [("probe", {})]


@pytest.mark.timeout(60)
def test_the_fuzz_runner_reports_rate_and_memory() -> None:
    """scripts/fuzz's engine, on a small run."""
    result = run(3000, seed=3, live_every=100)
    assert result["inputs"] == 3000 and result["per_second"] > 0
    assert result["slowest_input"] < 2.0
