"""Unit tests of the frame codec and of request checking: round trips,
golden bytes worked out by hand from docs/client-protocol.md, and one
malformed input per error the protocol lists (the Rust codec's table)."""

from __future__ import annotations

import os
import random
import struct
import sys
import unittest
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shoal_client import (  # noqa: E402
    Code,
    InvalidRequest,
    Limits,
    Reason,
    Service,
    ShoalError,
    default_socket_path,
)
from shoal_client import codec  # noqa: E402
from shoal_client._common import Requests, endpoint  # noqa: E402
from shoal_client.codec import (  # noqa: E402
    Connect,
    ConnectOk,
    Disconnect,
    ErrorFrame,
    FrameError,
    Join,
    Leave,
    Membership,
    Message,
    SELF_DISCARD,
    Multicast,
    Status,
    StatusReply,
    decode,
    encode,
)


def sample_frames() -> list[codec.Frame]:
    """At least one frame of every type, with edge values."""
    return [
        Connect("alice", ""),
        Connect("a" * 128, "t" * 255),
        Connect("alice", "", codec.MEMBERSHIP_DELTAS),
        Connect("alice", "", 2**32 - 1),
        codec.MembershipDelta("chat", 9, 8, Reason.JOIN, ["#b#n"], [], False, True),
        codec.MembershipDelta("chat", 2**64 - 1, 0, Reason.NETWORK, [], ["#a#n", "#c#n"], True, False),
        ConnectOk("#alice#a"),
        Join("chat"),
        Join("é" * 64),  # 128 bytes of UTF-8
        Leave("chat"),
        Multicast(Service.AGREED, ["chat"], b"hi"),
        Multicast(Service.SAFE, ["g1", "g2", "#bob#b"], b""),
        Multicast(Service.UNRELIABLE, [f"g{i}" for i in range(64)], bytes(range(256))),
        Message("#bob#b", Service.FIFO, ["chat"], b"hello"),
        Message("#bob#b", Service.CAUSAL, [], b"\x00" * (1 << 20)),
        Multicast(Service.AGREED, ["chat"], b"hi", 1, 0),
        Multicast(Service.FIFO, ["chat"], b"", 0, 65535),
        Message("#bob#b", Service.SAFE, ["chat"], b"typed", 513),
        Membership("chat", 7, Reason.JOIN, ["#alice#a", "#bob#b"]),
        Membership("chat", 2**64 - 1, Reason.LEAVE, []),
        Membership("chat", 0, Reason.DISCONNECT, ["#x#y"]),
        Membership("chat", 1 << 16, Reason.NETWORK, ["#x#y"]),
        Disconnect(),
        ErrorFrame(7, "you are not in group chat"),
        ErrorFrame(65535, ""),
        Status(),
        StatusReply("node: a\nclients: 1"),
        StatusReply(""),
        codec.FlowQuery(0),
        codec.FlowQuery(2**32 - 1),
        codec.FlowState(7, True, 2, 300, 40, 1 << 25),
        codec.FlowState(2**32 - 1, False, 0, 2**64 - 1, 0, 0),
        codec.GroupQuery(0, "chat"),
        codec.GroupMembers(2**32 - 1, "chat", 2**64 - 1, ["#alice#a", "#bob#b"]),
        codec.GroupMembers(3, "nobody", 0, []),
    ] + [Multicast(s, ["g"], s.label.encode()) for s in Service]


class RoundTrip(unittest.TestCase):
    def test_every_frame_decodes_to_itself_using_every_byte(self) -> None:
        for frame in sample_frames():
            with self.subTest(frame=type(frame).__name__):
                data = encode(frame)
                self.assertEqual(decode(data), (frame, len(data)))

    def test_every_proper_prefix_is_incomplete_not_an_error(self) -> None:
        for frame in sample_frames():
            data = encode(frame)
            if len(data) > 5000:
                cuts = list(range(40)) + [len(data) // 2, len(data) - 1]
            else:
                cuts = range(len(data))
            for cut in cuts:
                self.assertIsNone(decode(data[:cut]), f"{frame!r:.60} cut at {cut}")

    def test_frames_back_to_back_decode_one_at_a_time(self) -> None:
        data = encode(Join("g")) + encode(Disconnect()) + b"\x00\x00"
        first, used = decode(data)
        self.assertEqual(first, Join("g"))
        second, used2 = decode(data[used:])
        self.assertEqual(second, Disconnect())
        self.assertIsNone(decode(data[used + used2 :]))

    def test_random_frames_round_trip(self) -> None:
        rng = random.Random(5)
        alphabet = "abcXYZ09_#.-é€😀"

        def name() -> str:
            while True:
                text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
                if len(text.encode()) <= 128:
                    return text

        for _ in range(500):
            groups = [name() for _ in range(rng.randint(1, 5))]
            payload = rng.randbytes(rng.randint(0, 300))
            frame = rng.choice(
                [
                    Multicast(rng.choice(list(Service)), groups, payload),
                    Message(name(), rng.choice(list(Service)), groups, payload),
                    Membership(name(), rng.getrandbits(64), rng.choice(list(Reason)), groups),
                    ErrorFrame(rng.getrandbits(16), name()),
                ]
            )
            data = encode(frame)
            self.assertEqual(decode(data), (frame, len(data)))


class GoldenBytes(unittest.TestCase):
    """Frames written out field by field from the spec's tables."""

    def test_join(self) -> None:
        # length 5 (version, type, u16 length, "g"); version 2; type 3.
        self.assertEqual(encode(Join("g")), bytes([0, 0, 0, 5, 2, 3, 0, 1]) + b"g")

    def test_connect(self) -> None:
        want = bytes([0, 0, 0, 11, 2, 1, 0, 5]) + b"alice" + bytes([0, 0])
        self.assertEqual(encode(Connect("alice", "")), want)

    def test_disconnect_and_status(self) -> None:
        self.assertEqual(encode(Disconnect()), bytes([0, 0, 0, 2, 2, 8]))
        self.assertEqual(encode(Status()), bytes([0, 0, 0, 2, 2, 10]))

    def test_flow_query_and_state(self) -> None:
        # The same bytes as shoal_wire's test of these frames.
        self.assertEqual(encode(codec.FlowQuery(7)), bytes([0, 0, 0, 6, 2, 14, 0, 0, 0, 7]))
        want = bytes([0, 0, 0, 35, 2, 15, 0, 0, 0, 1, 1, 0, 0, 0, 2]) + b"".join(
            struct.pack(">Q", v) for v in (3, 4, 5)
        )
        self.assertEqual(encode(codec.FlowState(1, True, 2, 3, 4, 5)), want)

    def test_group_query_and_members(self) -> None:
        # The same bytes as shoal_wire's test of these frames.
        self.assertEqual(
            encode(codec.GroupQuery(7, "g")),
            bytes([0, 0, 0, 9, 2, 16, 0, 0, 0, 7, 0, 1]) + b"g",
        )
        want = (
            bytes([0, 0, 0, 31, 2, 17, 0, 0, 0, 1, 0, 1]) + b"g" + struct.pack(">Q", 5)
            + bytes([0, 2, 0, 4]) + b"#a#n" + bytes([0, 4]) + b"#b#n"
        )
        self.assertEqual(encode(codec.GroupMembers(1, "g", 5, ["#a#n", "#b#n"])), want)
        # The group name is checked as a join's: an empty one is refused.
        with self.assertRaises(codec.FrameError):
            decode(bytes([0, 0, 0, 8, 2, 16, 0, 0, 0, 7, 0, 0]))

    def test_multicast(self) -> None:
        # service 5 (agreed); 1 group "chat"; payload of 2 bytes "hi".
        body = bytes([2, 5, 5, 0, 1, 0, 4]) + b"chat" + bytes([0, 0, 0, 2]) + b"hi"
        want = struct.pack(">I", len(body)) + body
        self.assertEqual(len(body), 17)
        self.assertEqual(encode(Multicast(Service.AGREED, ["chat"], b"hi")), want)
        self.assertEqual(decode(want)[0], Multicast(Service.AGREED, ["chat"], b"hi"))

    def test_membership(self) -> None:
        # group "g", view id 0x0102 as u64, reason 3 (network), flags 2
        # (regular, quorum held), members ["#a#h"].
        want = (
            bytes([0, 0, 0, 23, 2, 7, 0, 1])
            + b"g"
            + bytes([0, 0, 0, 0, 0, 0, 1, 2, 3, 2, 0, 1, 0, 4])
            + b"#a#h"
        )
        frame = Membership("g", 0x0102, Reason.NETWORK, ["#a#h"])
        self.assertEqual(encode(frame), want)
        self.assertEqual(decode(want), (frame, 27))
        # A transitional view without the quorum: flags 1.
        cut = Membership("g", 0x0102, Reason.NETWORK, ["#a#h"], transitional=True, quorum=False)
        self.assertEqual(encode(cut)[18], 1)
        self.assertEqual(decode(encode(cut))[0], cut)

    def test_message_and_error(self) -> None:
        want = (
            bytes([0, 0, 0, 20, 2, 6, 0, 4])
            + b"#b#n"
            + bytes([3, 0, 1, 0, 1])
            + b"g"
            + bytes([0, 0, 0, 2])
            + b"yo"
        )
        self.assertEqual(encode(Message("#b#n", Service.FIFO, ["g"], b"yo")), want)
        self.assertEqual(encode(ErrorFrame(7, "no")), bytes([0, 0, 0, 8, 2, 9, 0, 7, 0, 2]) + b"no")

    def test_extended_multicast_and_message(self) -> None:
        # type 12: service 5, flags 1 (self-discard), type 0x0102, 1 group
        # "g", payload "p"; type 13: sender, service, type, groups, payload.
        multicast = raw(bytes([12, 5, 1, 1, 2, 0, 1, 0, 1]) + b"g" + bytes([0, 0, 0, 1]) + b"p")
        frame = Multicast(Service.AGREED, ["g"], b"p", SELF_DISCARD, 0x0102)
        self.assertEqual(encode(frame), multicast)
        self.assertEqual(decode(multicast)[0], frame)
        message = raw(
            bytes([13, 0, 4]) + b"#b#n" + bytes([5, 1, 2, 0, 1, 0, 1]) + b"g" + bytes([0, 0, 0, 1])
            + b"p"
        )
        typed = Message("#b#n", Service.AGREED, ["g"], b"p", 0x0102)
        self.assertEqual(encode(typed), message)
        self.assertEqual(decode(message)[0], typed)
        # Zero flags and type: the plain frames, as older daemons read them.
        self.assertEqual(encode(Multicast(Service.AGREED, ["g"], b"p", 0, 0))[5], 5)
        self.assertEqual(encode(Message("#b#n", Service.AGREED, ["g"], b"p", 0))[5], 6)

    def test_protocol_values(self) -> None:
        self.assertEqual(
            [(s.label, int(s)) for s in Service],
            [
                ("unreliable", 0),
                ("probabilistic", 1),
                ("reliable", 2),
                ("fifo", 3),
                ("causal", 4),
                ("agreed", 5),
                ("safe", 6),
            ],
        )
        self.assertEqual([int(r) for r in Reason], [0, 1, 2, 3])
        self.assertEqual(
            {c.name: int(c) for c in Code},
            {
                "MALFORMED": 1,
                "PROTOCOL": 2,
                "NAME_TAKEN": 3,
                "AUTH": 4,
                "UNSUPPORTED_SERVICE": 5,
                "LIMIT": 6,
                "BAD_GROUP": 7,
                "SLOW_CLIENT": 8,
                "SHUTDOWN": 9,
                "UNAVAILABLE": 10,
            },
        )

    def test_frame_max_matches_the_rust_limits(self) -> None:
        # 18 bytes of fixed fields, (2 + 128) * (1 + 65535) of names, 1 MiB.
        self.assertEqual(Limits().frame_max(), 28 + 130 * 65536 + (1 << 20))


def raw(rest: bytes) -> bytes:
    """A frame: length prefix, version 2, then ``rest``."""
    return struct.pack(">I", len(rest) + 1) + bytes([2]) + rest


def join_raw(name: bytes) -> bytes:
    return raw(bytes([3]) + struct.pack(">H", len(name)) + name)


class Malformed(unittest.TestCase):
    """One malformed frame per error the protocol lists, with the Rust
    codec's message."""

    CASES = [
        (
            "length beyond the maximum",
            b"\xff\xff\xff\xff\x01\x01",
            "too_long",
            f"frame of {2**32 - 1} bytes exceeds the maximum {Limits().frame_max()}",
        ),
        ("zero length", b"\x00\x00\x00\x00", "too_short", "frame too short: 0 bytes"),
        ("length one", b"\x00\x00\x00\x01\x01", "too_short", "frame too short: 1 bytes"),
        ("other version", b"\x00\x00\x00\x02\x09\x08", "bad_version",
         "unsupported client-protocol version 9"),
        ("unknown type", raw(bytes([77])), "unknown_type", "unknown frame type 77"),
        ("type zero", raw(bytes([0])), "unknown_type", "unknown frame type 0"),
        ("truncated name", raw(bytes([3, 0, 5]) + b"a"), "truncated", "truncated group name"),
        ("empty name", join_raw(b""), "empty", "an empty group name"),
        ("name over the limit", join_raw(b"a" * 129), "over_limit",
         "group name of 129 exceeds the limit 128"),
        ("bad UTF-8", join_raw(b"\xff\xfe"), "bad_utf8", "group name is not valid UTF-8"),
        ("surrogate in UTF-8", join_raw(b"\xed\xa0\x80"), "bad_utf8",
         "group name is not valid UTF-8"),
        ("trailing bytes", raw(bytes([8, 0])), "trailing_bytes",
         "1 bytes left over after the frame's body"),
        ("unknown service", raw(bytes([5, 9, 0, 1, 0, 1]) + b"g" + bytes(4)), "bad_service",
         "unknown service 9"),
        ("no groups", raw(bytes([5, 3, 0, 0, 0, 0, 0, 0])), "empty", "an empty group list"),
        ("group count beyond the bytes", raw(bytes([5, 3, 0xFF, 0xFF])), "over_limit",
         "groups of 65535 exceeds the limit 0"),
        ("more groups than the limit",
         raw(bytes([5, 3, 0, 65]) + b"\x00\x01g" * 65 + bytes(4)), "over_limit",
         "groups of 65 exceeds the limit 64"),
        ("payload over the limit",
         raw(bytes([5, 3, 0, 1, 0, 1]) + b"g" + bytes([0, 0x20, 0, 1])), "over_limit",
         f"payload of {(1 << 21) + 1} exceeds the limit {1 << 20}"),
        ("payload cut short", raw(bytes([5, 3, 0, 1, 0, 1]) + b"g" + bytes([0, 0, 0, 5]) + b"ab"),
         "truncated", "truncated payload"),
        ("unknown reason",
         raw(bytes([7, 0, 1]) + b"g" + bytes([0, 0, 0, 0, 0, 0, 0, 1, 7, 0, 0])), "bad_reason",
         "unknown membership reason 7"),
        ("view id cut short", raw(bytes([7, 0, 1]) + b"g" + bytes([0, 0, 0])), "truncated",
         "truncated view id"),
        ("token over 255 bytes",
         raw(bytes([1, 0, 1]) + b"a" + struct.pack(">H", 256) + b"t" * 256), "over_limit",
         "token of 256 exceeds the limit 255"),
        ("error code cut short", raw(bytes([9, 0])), "truncated", "truncated error code"),
        ("empty sender", raw(bytes([6, 0, 0, 3, 0, 0, 0, 0, 0, 0])), "empty", "an empty sender"),
        ("unknown multicast flags",
         raw(bytes([12, 3, 0x82, 0, 1, 0, 1]) + b"g" + bytes(4)), "bad_flags",
         "unknown multicast flags 0x82"),
        ("unknown flow-state flags", raw(bytes([15, 0, 0, 0, 1, 2])), "bad_flags",
         "unknown flow-state flags 0x02"),
        ("flow query cut short", raw(bytes([14, 0, 0])), "truncated", "truncated nonce"),
        ("extended multicast with no groups", raw(bytes([12, 3, 1, 0, 1, 0, 0]) + bytes(4)),
         "empty", "an empty group list"),
    ]

    def test_each_irregularity_is_refused_with_its_error(self) -> None:
        for what, data, kind, message in self.CASES:
            with self.subTest(what):
                with self.assertRaises(FrameError) as caught:
                    decode(data)
                self.assertEqual(caught.exception.kind, kind)
                self.assertEqual(str(caught.exception), message)

    def test_arbitrary_bytes_raise_only_frame_errors(self) -> None:
        rng = random.Random(1)
        valid = [encode(f) for f in sample_frames() if len(encode(f)) < 400]
        for _ in range(5000):
            if rng.random() < 0.5:
                data = bytearray(rng.choice(valid))
                for _ in range(rng.randint(1, 4)):
                    data[rng.randrange(len(data))] = rng.getrandbits(8)
            else:
                data = bytearray(rng.randbytes(rng.randint(0, 60)))
            try:
                decoded = decode(bytes(data))
            except FrameError:
                continue
            if decoded is not None:
                # A frame that decodes re-encodes to the same bytes.
                frame, used = decoded
                self.assertEqual(encode(frame), bytes(data[:used]))

    def test_smaller_limits_are_enforced(self) -> None:
        small = Limits(name_max=4, payload_max=3)
        with self.assertRaises(FrameError):
            decode(encode(Join("abcde")), small)
        with self.assertRaises(FrameError):
            decode(encode(Multicast(Service.FIFO, ["g"], b"abcd")), small)
        self.assertIsNotNone(decode(encode(Join("abcd")), small))

    def test_unencodable_fields_are_refused(self) -> None:
        with self.assertRaises(FrameError):
            encode(Join("x" * 65536))
        with self.assertRaises(FrameError):
            encode(ErrorFrame(65536, "too big a code"))
        with self.assertRaises(FrameError):
            encode(Join("\ud800"))
        with self.assertRaises(TypeError):
            encode("not a frame")  # type: ignore[arg-type]


class RequestChecks(unittest.TestCase):
    """What the client refuses before sending (the daemon would close the
    connection on it)."""

    def setUp(self) -> None:
        self.req = Requests(Limits())

    def test_names_are_non_empty_and_at_most_128_bytes(self) -> None:
        self.assertEqual(decode(self.req.join("a" * 128))[0], Join("a" * 128))
        for bad in ["", "a" * 129, "é" * 65]:
            with self.subTest(len(bad)), self.assertRaises(InvalidRequest):
                self.req.join(bad)
        with self.assertRaisesRegex(InvalidRequest, "is 129 bytes; the limit is 128"):
            self.req.leave("b" * 129)
        with self.assertRaisesRegex(InvalidRequest, "empty private name"):
            self.req.connect("", "")
        with self.assertRaisesRegex(InvalidRequest, "a group name is a str"):
            self.req.join(b"g")  # type: ignore[arg-type]

    def test_token_at_most_255_bytes(self) -> None:
        self.assertEqual(decode(self.req.connect("me", "t" * 255))[0], Connect("me", "t" * 255, 1))
        with self.assertRaisesRegex(InvalidRequest, "token is 256 bytes"):
            self.req.connect("me", "t" * 256)

    def test_multicast_checks(self) -> None:
        self.assertEqual(
            decode(self.req.multicast(Service.FIFO, ["a", "b"], b"x"))[0],
            Multicast(Service.FIFO, ["a", "b"], b"x"),
        )
        # One str is one group, not a list of letters; services by name or number.
        self.assertEqual(
            decode(self.req.multicast("agreed", "chat", bytearray(b"x")))[0],
            Multicast(Service.AGREED, ["chat"], b"x"),
        )
        self.assertEqual(decode(self.req.multicast(6, ("g",), memoryview(b"")))[0].service,
                         Service.SAFE)
        self.assertEqual(len(self.req.multicast(Service.FIFO, ["g"], bytes(1 << 20))),
                         4 + 2 + 1 + 2 + 3 + 4 + (1 << 20))
        bad = [
            ((Service.FIFO, [], b"x"), "at least one group"),
            ((Service.FIFO, [f"g{i}" for i in range(65)], b"x"), "65 groups; the limit is 64"),
            ((Service.FIFO, ["g", ""], b"x"), "empty group name"),
            ((Service.FIFO, ["g"], bytes((1 << 20) + 1)), "payload of 1048577 bytes"),
            ((Service.FIFO, ["g"], "text"), "encode the str"),
            ((9, ["g"], b"x"), "unknown service 9"),
            (("totally-ordered", ["g"], b"x"), "unknown service 'totally-ordered'"),
        ]
        for args, message in bad:
            with self.subTest(message), self.assertRaisesRegex(InvalidRequest, message):
                self.req.multicast(*args)

    def test_a_batch_is_its_frames_back_to_back_or_nothing(self) -> None:
        payloads = [b"one", b"", bytes(5000)]
        # The groups may be a one-shot iterator: every frame still names them.
        data = self.req.multicast_batch(Service.FIFO, iter(["g", "h"]), iter(payloads))
        self.assertEqual(
            data,
            b"".join(self.req.multicast(Service.FIFO, ["g", "h"], p) for p in payloads),
        )
        got, at = [], 0
        while at < len(data):
            frame, used = decode(data[at:])
            got.append(frame)
            at += used
        self.assertEqual(got, [Multicast(Service.FIFO, ["g", "h"], p) for p in payloads])
        self.assertEqual(self.req.multicast_batch(Service.FIFO, "g", []), b"")
        with self.assertRaisesRegex(InvalidRequest, "payload 1 of the batch: a payload of"):
            self.req.multicast_batch(Service.FIFO, "g", [b"ok", bytes((1 << 20) + 1)])

    def test_endpoints(self) -> None:
        self.assertEqual(endpoint("/x/s.sock", None, None).path, Path("/x/s.sock"))
        tcp = endpoint(None, "127.0.0.1:4803", "secret")
        self.assertEqual((tcp.host, tcp.port, tcp.token), ("127.0.0.1", 4803, "secret"))
        self.assertEqual(endpoint(None, "[::1]:9", None).host, "::1")
        for socket, tcp_addr, token in [
            ("/s", "h:1", None),
            (None, "nohost", None),
            (None, "h:99999", None),
            ("/s", None, "token"),
        ]:
            with self.assertRaises(InvalidRequest):
                endpoint(socket, tcp_addr, token)

    def test_default_socket_path(self) -> None:
        with mock.patch.dict(os.environ, {"XDG_RUNTIME_DIR": "/run/user/7"}):
            self.assertEqual(default_socket_path(), Path("/run/user/7/shoal.sock"))
        for env in [{"XDG_RUNTIME_DIR": ""}, {}]:
            with mock.patch.dict(os.environ, env, clear=True):
                uid = os.stat("/proc/self").st_uid
                self.assertEqual(default_socket_path(), Path(f"/tmp/shoal-{uid}.sock"))

    def test_daemon_errors_carry_code_and_text(self) -> None:
        e = ShoalError(7, "you are not in group x")
        self.assertEqual((e.code, e.text), (Code.BAD_GROUP, "you are not in group x"))
        self.assertEqual(str(e), "you are not in group x (code 7)")
        self.assertEqual(ShoalError(999, "new").code, 999)


if __name__ == "__main__":
    unittest.main()
