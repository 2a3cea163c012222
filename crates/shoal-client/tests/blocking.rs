//! The blocking client against a fake daemon.

mod common;

use std::time::Duration;

use common::{message, FakeDaemon, BOUND};
use shoal_client::{
    code, Client, ClientError, Endpoint, FrameError, Limits, Membership, Message, Reason, Received,
    SendOptions, Service,
};
use shoal_wire::client::Frame;

#[test]
fn connect_handshake() {
    let daemon = FakeDaemon::unix(|mut peer| {
        let (name, token) = peer.accept("#alice#h1");
        assert_eq!(name, "alice");
        assert_eq!(token, "", "no token over the Unix socket");
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let client = Client::connect_to(&daemon.endpoint(), "alice").unwrap();
    assert_eq!(client.private_group(), "#alice#h1");
    client.disconnect().unwrap();
    daemon.finish();
}

#[test]
fn connect_refused_with_an_error() {
    let daemon = FakeDaemon::unix(|mut peer| {
        assert!(matches!(peer.read_frame(), Frame::ConnectExt { .. }));
        peer.send(&Frame::Error {
            code: code::NAME_TAKEN,
            text: "name alice is taken".into(),
        });
    });
    match Client::connect_to(&daemon.endpoint(), "alice") {
        Err(ClientError::Daemon { code, text }) => {
            assert_eq!(code, code::NAME_TAKEN);
            assert_eq!(text, "name alice is taken");
        }
        other => panic!("expected a daemon error, got {other:?}"),
    }
    daemon.finish();
}

#[test]
fn connect_closed_before_answering() {
    let daemon = FakeDaemon::unix(|mut peer| {
        assert!(matches!(peer.read_frame(), Frame::ConnectExt { .. }));
    });
    let result = Client::connect_to(&daemon.endpoint(), "alice");
    assert!(
        matches!(result, Err(ClientError::Disconnected)),
        "{result:?}"
    );
    daemon.finish();
}

#[test]
fn connect_to_no_daemon() {
    let path = std::env::temp_dir().join(format!("shoal-client-none-{}.sock", std::process::id()));
    let result = Client::connect_to(&Endpoint::Unix(path), "alice");
    assert!(
        matches!(result, Err(ClientError::Unreachable { .. })),
        "{result:?}"
    );
}

#[test]
fn tcp_sends_the_token() {
    let (daemon, addr) = FakeDaemon::tcp(|mut peer| {
        let (name, token) = peer.accept("#bob#h1");
        assert_eq!(name, "bob");
        assert_eq!(token, "s3cret");
        assert_eq!(peer.read_frame(), Frame::Join { group: "g".into() });
        peer.send(&message("#x#h", &["g"], b"over tcp"));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let endpoint = Endpoint::Tcp {
        addr,
        token: "s3cret".into(),
    };
    let mut client = Client::connect_to(&endpoint, "bob").unwrap();
    client.join("g").unwrap();
    match client.receive().unwrap() {
        Received::Message(m) => assert_eq!(m.payload, b"over tcp"),
        other => panic!("{other:?}"),
    }
    client.disconnect().unwrap();
    daemon.finish();
}

#[test]
fn requests_arrive_encoded() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        assert_eq!(peer.read_frame(), Frame::Join { group: "g1".into() });
        assert_eq!(peer.read_frame(), Frame::Join { group: "g2".into() });
        assert_eq!(
            peer.read_frame(),
            Frame::Multicast {
                service: Service::Causal,
                groups: vec!["g1".into(), "g2".into()],
                payload: b"to both".to_vec(),
            }
        );
        assert_eq!(
            peer.read_frame(),
            Frame::Multicast {
                service: Service::Unreliable,
                groups: vec!["g1".into()],
                payload: Vec::new(),
            }
        );
        assert_eq!(
            peer.read_frame(),
            Frame::Multicast {
                service: Service::Safe,
                groups: vec!["g2".into()],
                payload: vec![0xab; 1 << 20],
            }
        );
        assert_eq!(peer.read_frame(), Frame::Leave { group: "g1".into() });
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    client.join("g1").unwrap();
    client.join("g2").unwrap();
    client
        .multicast(Service::Causal, &["g1", "g2"], b"to both")
        .unwrap();
    // Refused locally, nothing sent.
    let none: [&str; 0] = [];
    assert!(matches!(
        client.multicast(Service::Agreed, &none, b"x"),
        Err(ClientError::Invalid(_))
    ));
    assert!(matches!(client.join(""), Err(ClientError::Invalid(_))));
    let owned = vec!["g1".to_string()];
    client.multicast(Service::Unreliable, &owned, b"").unwrap();
    client
        .multicast(Service::Safe, &["g2"], &vec![0xab; 1 << 20])
        .unwrap();
    client.leave("g1").unwrap();
    client.disconnect().unwrap();
    daemon.finish();
}

#[test]
fn messages_and_views_are_received() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        peer.send(&Frame::Membership {
            group: "g".into(),
            view_id: 3,
            reason: Reason::Join,
            transitional: false,
            quorum: true,
            members: vec!["#a#h".into(), "#b#h".into()],
        });
        peer.send(&Frame::Message {
            sender: "#b#h".into(),
            service: Service::Fifo,
            groups: vec!["g".into(), "h".into()],
            payload: b"hi".to_vec(),
        });
        // Two frames in one write.
        let mut both = message("#b#h", &["g"], b"one").to_vec().unwrap();
        both.extend(message("#b#h", &["g"], b"two").to_vec().unwrap());
        peer.send_raw(&both);
        // A large one.
        peer.send(&message("#b#h", &["g"], &vec![7; 1 << 20]));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    assert_eq!(
        client.receive().unwrap(),
        Received::Membership(
            Membership::new(
                "g",
                3,
                Reason::Join,
                false,
                true,
                vec!["#a#h".into(), "#b#h".into()],
            )
            .with_changes(vec!["#a#h".into()], vec![])
        )
    );
    assert_eq!(
        client.receive().unwrap(),
        Received::Message(Message {
            sender: "#b#h".into(),
            service: Service::Fifo,
            groups: vec!["g".into(), "h".into()],
            mess_type: 0,
            payload: b"hi".to_vec(),
        })
    );
    for want in [&b"one"[..], b"two"] {
        match client.receive().unwrap() {
            Received::Message(m) => assert_eq!(m.payload, want),
            other => panic!("{other:?}"),
        }
    }
    match client.receive_timeout(BOUND).unwrap() {
        Some(Received::Message(m)) => assert_eq!(m.payload, vec![7; 1 << 20]),
        other => panic!("{other:?}"),
    }
    client.disconnect().unwrap();
    daemon.finish();
}

#[test]
fn a_frame_in_many_small_writes_is_reassembled() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        // Byte by byte with pauses, so the client sees many short reads.
        let small = message("#b#h", &["g"], b"slowly").to_vec().unwrap();
        peer.send_in_pieces(&small, 1, Duration::from_millis(2));
        // A large frame in 1000-byte writes.
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let large = message("#b#h", &["g"], &payload).to_vec().unwrap();
        peer.send_in_pieces(&large, 1000, Duration::ZERO);
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    match client.receive().unwrap() {
        Received::Message(m) => assert_eq!(m.payload, b"slowly"),
        other => panic!("{other:?}"),
    }
    match client.receive().unwrap() {
        Received::Message(m) => {
            let want: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            assert_eq!(m.payload, want);
        }
        other => panic!("{other:?}"),
    }
    client.disconnect().unwrap();
    daemon.finish();
}

#[test]
fn eof_is_disconnected() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        // Dropping the peer closes the connection.
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    daemon.finish();
    assert!(matches!(client.receive(), Err(ClientError::Disconnected)));
    assert!(matches!(client.receive(), Err(ClientError::Disconnected)));
}

#[test]
fn disconnect_frame_is_disconnected() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        peer.send(&Frame::Disconnect);
        assert_eq!(peer.try_read_frame(), None);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    assert!(matches!(client.receive(), Err(ClientError::Disconnected)));
    drop(client);
    daemon.finish();
}

#[test]
fn daemon_errors_come_from_receive_and_the_connection_goes_on() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        assert!(matches!(peer.read_frame(), Frame::Multicast { .. }));
        peer.send(&Frame::Error {
            code: code::UNSUPPORTED_SERVICE,
            text: "service safe is not implemented yet".into(),
        });
        peer.send(&message("#b#h", &["g"], b"still here"));
        peer.send(&Frame::Error {
            code: code::SHUTDOWN,
            text: "the daemon is shutting down".into(),
        });
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    client.multicast(Service::Safe, &["g"], b"x").unwrap();
    let e = client.receive().unwrap_err();
    assert_eq!(e.code(), Some(code::UNSUPPORTED_SERVICE));
    assert_eq!(
        e.to_string(),
        format!(
            "service safe is not implemented yet (code {})",
            code::UNSUPPORTED_SERVICE
        )
    );
    assert!(matches!(client.receive(), Ok(Received::Message(_))));
    assert_eq!(client.receive().unwrap_err().code(), Some(code::SHUTDOWN));
    assert!(client.receive().unwrap_err().is_disconnected());
    daemon.finish();
}

#[test]
fn disconnect_reports_an_error_still_pending() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        assert!(matches!(peer.read_frame(), Frame::Multicast { .. }));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
        // The daemon answers frames in order: the refusal, then the close.
        peer.send(&message("#b#h", &["g"], b"dropped"));
        peer.send(&Frame::Error {
            code: code::UNSUPPORTED_SERVICE,
            text: "no safe".into(),
        });
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    client.multicast(Service::Safe, &["g"], b"x").unwrap();
    let e = client.disconnect().unwrap_err();
    assert_eq!(e.code(), Some(code::UNSUPPORTED_SERVICE));
    daemon.finish();
}

#[test]
fn garbage_is_a_protocol_error() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        // A frame of version 9.
        peer.send_raw(&[0, 0, 0, 3, 9, 9, 9]);
        assert_eq!(peer.try_read_frame(), None);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    match client.receive() {
        Err(ClientError::Protocol(FrameError::BadVersion(9))) => {}
        other => panic!("expected a protocol error, got {other:?}"),
    }
    drop(client);
    daemon.finish();
}

#[test]
fn an_unexpected_frame_is_reported() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        peer.send(&Frame::ConnectOk {
            private_group: "#a#h".into(),
        });
        assert_eq!(peer.try_read_frame(), None);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    assert!(matches!(
        client.receive(),
        Err(ClientError::Unexpected("ConnectOk"))
    ));
    drop(client);
    daemon.finish();
}

#[test]
fn limits_apply_to_what_is_received() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        peer.send(&message("#b#h", &["g"], &[1; 100]));
        assert_eq!(peer.try_read_frame(), None);
    });
    let limits = Limits {
        payload_max: 10,
        ..Limits::default()
    };
    let mut client = Client::connect_with_limits(&daemon.endpoint(), "a", limits).unwrap();
    assert!(matches!(
        client.multicast(Service::Agreed, &["g"], &[0; 11]),
        Err(ClientError::Invalid(_))
    ));
    assert!(matches!(client.receive(), Err(ClientError::Protocol(_))));
    drop(client);
    daemon.finish();
}

#[test]
fn receive_timeout_returns_none_on_silence() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        // Half a frame, then silence until the client joins.
        let frame = message("#b#h", &["g"], b"after the join").to_vec().unwrap();
        peer.send_raw(&frame[..7]);
        assert_eq!(peer.read_frame(), Frame::Join { group: "g".into() });
        peer.send_raw(&frame[7..]);
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    assert_eq!(
        client.receive_timeout(Duration::from_millis(50)).unwrap(),
        None
    );
    assert_eq!(client.receive_timeout(Duration::ZERO).unwrap(), None);
    client.join("g").unwrap();
    match client.receive_timeout(BOUND).unwrap() {
        Some(Received::Message(m)) => assert_eq!(m.payload, b"after the join"),
        other => panic!("{other:?}"),
    }
    client.disconnect().unwrap();
    daemon.finish();
}

#[test]
fn split_halves_send_and_receive_on_two_threads() {
    const N: usize = 200;
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        // Echo each multicast back as a message; then the client's goodbye.
        loop {
            match peer.read_frame() {
                Frame::Multicast {
                    groups, payload, ..
                } => {
                    let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                    peer.send(&message("#a#h", &groups, &payload));
                }
                Frame::Disconnect => return,
                other => panic!("{other:?}"),
            }
        }
    });
    let client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    let (mut send, mut recv) = client.split();
    assert_eq!(send.private_group(), "#a#h");
    assert_eq!(recv.private_group(), "#a#h");
    let receiver = std::thread::spawn(move || {
        let mut got = Vec::new();
        loop {
            match recv.receive() {
                Ok(Received::Message(m)) => got.push(m.payload),
                Err(ClientError::Disconnected) => return got,
                other => panic!("{other:?}"),
            }
        }
    });
    for i in 0..N {
        send.multicast(Service::Fifo, &["g"], i.to_string().as_bytes())
            .unwrap();
    }
    send.disconnect().unwrap();
    let got = receiver.join().unwrap();
    let want: Vec<Vec<u8>> = (0..N).map(|i| i.to_string().into_bytes()).collect();
    assert_eq!(got, want);
    daemon.finish();
}

#[test]
fn a_batch_arrives_as_consecutive_multicasts_and_a_refused_one_sends_nothing() {
    let payloads: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 1000]).collect();
    let expected = payloads.clone();
    let daemon = FakeDaemon::unix(move |mut peer| {
        peer.accept("#a#h");
        for payload in expected {
            assert_eq!(
                peer.read_frame(),
                Frame::Multicast {
                    service: Service::Fifo,
                    groups: vec!["g".into()],
                    payload,
                }
            );
        }
        // The refused batch sent nothing: the next frame is the goodbye.
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    client
        .multicast_batch(Service::Fifo, &["g"], &payloads)
        .unwrap();
    let too_big = vec![0u8; shoal_client::Limits::default().payload_max + 1];
    let refused = client.multicast_batch(Service::Fifo, &["g"], &[&b"ok"[..], &too_big]);
    assert!(
        matches!(&refused, Err(ClientError::Invalid(why)) if why.contains("payload 1")),
        "{refused:?}"
    );
    client.disconnect().unwrap();
    daemon.finish();
}

#[test]
fn options_self_discard_and_types_travel_in_the_extended_frames() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#n7");
        let ext = |flags, mess_type, payload: &[u8]| Frame::MulticastExt {
            service: Service::Agreed,
            flags,
            mess_type,
            groups: vec!["g".into()],
            payload: payload.to_vec(),
        };
        // The connection's default, then per message.
        assert_eq!(peer.read_frame(), ext(1, 0, b"1"));
        assert_eq!(peer.read_frame(), ext(0, 42, b"2"));
        assert_eq!(
            peer.read_frame(),
            Frame::Multicast {
                service: Service::Agreed,
                groups: vec!["g".into()],
                payload: b"3".to_vec(),
            }
        );
        peer.send(&Frame::MessageExt {
            sender: "#b#n7".into(),
            service: Service::Agreed,
            mess_type: 42,
            groups: vec!["g".into()],
            payload: b"typed".to_vec(),
        });
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    assert_eq!((client.name(), client.daemon()), ("a", "n7"));
    client.set_self_discard(true);
    client.multicast(Service::Agreed, &["g"], b"1").unwrap();
    let typed = SendOptions {
        self_discard: false,
        mess_type: 42,
    };
    client
        .multicast_with(Service::Agreed, &["g"], b"2", typed)
        .unwrap();
    client.set_self_discard(false);
    client.multicast(Service::Agreed, &["g"], b"3").unwrap();
    match client.receive_timeout(BOUND).unwrap() {
        Some(Received::Message(m)) => {
            assert_eq!((m.mess_type, &m.payload[..]), (42, &b"typed"[..]))
        }
        other => panic!("{other:?}"),
    }
    client.disconnect().unwrap();
    daemon.finish();
}

/// A daemon that does not read: `try_multicast` fills the socket, then
/// reports back-pressure without blocking; once the daemon reads, the
/// pending bytes go first and every accepted message arrives whole.
#[test]
fn try_multicast_reports_back_pressure_and_loses_nothing() {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<usize>();
    let daemon = FakeDaemon::unix(move |mut peer| {
        peer.accept("#a#n");
        let accepted = go_rx.recv().unwrap();
        for i in 0..accepted {
            match peer.read_frame() {
                Frame::Multicast { payload, .. } => {
                    assert_eq!(&payload[..8], &(i as u64).to_be_bytes())
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    let mut accepted = 0usize;
    let mut payload = vec![0u8; 10_000];
    loop {
        payload[..8].copy_from_slice(&(accepted as u64).to_be_bytes());
        match client.try_multicast(Service::Fifo, &["g"], &payload, SendOptions::default()) {
            Ok(()) => accepted += 1,
            Err(ClientError::WouldBlock) => break,
            Err(e) => panic!("{e}"),
        }
        assert!(accepted < 100_000, "the socket never filled");
    }
    assert!(accepted > 0);
    assert!(matches!(
        client.flow_control().unwrap(),
        shoal_client::FlowControl::Blocked { pending_bytes } if pending_bytes > 0
    ));
    go_tx.send(accepted).unwrap();
    client.flush().unwrap();
    assert_eq!(
        client.flow_control().unwrap(),
        shoal_client::FlowControl::Clear
    );
    client.disconnect().unwrap();
    daemon.finish();
}

#[test]
fn try_receive_never_waits_and_the_descriptor_polls_readable() {
    use std::os::fd::AsRawFd;
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let daemon = FakeDaemon::unix(move |mut peer| {
        peer.accept("#a#n");
        go_rx.recv().unwrap();
        peer.send(&message("#b#n", &["g"], b"one"));
        peer.send(&message("#b#n", &["g"], b"two"));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    assert!(client.try_receive().unwrap().is_none());
    go_tx.send(()).unwrap();
    let fd = client.as_raw_fd();
    assert!(poll_readable(fd, BOUND));
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + BOUND;
    while got.len() < 2 && std::time::Instant::now() < deadline {
        match client.try_receive().unwrap() {
            Some(Received::Message(m)) => got.push(m.payload),
            Some(other) => panic!("{other:?}"),
            None => {
                poll_readable(fd, Duration::from_millis(100));
            }
        }
    }
    assert_eq!(got, vec![b"one".to_vec(), b"two".to_vec()]);
    client.disconnect().unwrap();
    daemon.finish();
}

/// Whether `fd` becomes readable within `timeout`, asked of epoll
/// through tokio (as an application's event loop would). `AsyncFd::new`
/// on a raw descriptor is deprecated for lack of I/O safety; here the
/// client owning it outlives the `AsyncFd`, dropped before returning.
#[allow(deprecated)]
fn poll_readable(fd: i32, timeout: Duration) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let afd = tokio::io::unix::AsyncFd::new(fd).unwrap();
        tokio::time::timeout(timeout, afd.readable()).await.is_ok()
    })
}

#[test]
fn status_asks_without_connecting() {
    let daemon = FakeDaemon::unix(|mut peer| {
        assert_eq!(peer.read_frame(), Frame::Status);
        peer.send(&Frame::StatusReply {
            text: "node: a\nclients: 0".into(),
        });
    });
    let text = shoal_client::status(&daemon.endpoint(), BOUND).unwrap();
    assert_eq!(text, "node: a\nclients: 0");
    daemon.finish();
    let nobody = Endpoint::Unix("/nonexistent/shoal.sock".into());
    assert!(matches!(
        shoal_client::status(&nobody, BOUND),
        Err(ClientError::Unreachable { .. })
    ));
}

fn flow_state(nonce: u32, queued_bytes: u64) -> Frame {
    Frame::FlowState {
        nonce,
        accepting: true,
        held_messages: 3,
        held_bytes: 300,
        queued_bytes,
        queue_limit: 1 << 25,
    }
}

#[test]
fn flow_control_state_asks_the_daemon_and_keeps_what_arrives_meanwhile() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        assert_eq!(peer.read_frame(), Frame::FlowQuery { nonce: 1 });
        // A message queued ahead of the answer.
        peer.send(&message("#b#h", &["g"], b"before"));
        peer.send(&flow_state(1, 40));
        // The second query goes unanswered in time; its late answer comes
        // before the next message.
        assert_eq!(peer.read_frame(), Frame::FlowQuery { nonce: 2 });
        assert_eq!(peer.read_frame(), Frame::Join { group: "g".into() });
        peer.send(&flow_state(2, 0));
        peer.send(&message("#b#h", &["g"], b"after"));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    let state = client.flow_control_state(BOUND).unwrap();
    assert_eq!(state.client_pending_bytes, 0);
    let flow = state.daemon.expect("answered");
    assert_eq!(
        (flow.held_messages, flow.held_bytes, flow.queued_bytes),
        (3, 300, 40)
    );
    assert!(flow.accepting);
    match client.receive().unwrap() {
        Received::Message(m) => assert_eq!(m.payload, b"before"),
        other => panic!("{other:?}"),
    }
    let state = client
        .flow_control_state(Duration::from_millis(50))
        .unwrap();
    assert_eq!(state.daemon, None, "no answer in time");
    client.join("g").unwrap();
    // The late answer is not an event.
    match client.receive_timeout(BOUND).unwrap() {
        Some(Received::Message(m)) => assert_eq!(m.payload, b"after"),
        other => panic!("{other:?}"),
    }
    client.disconnect().unwrap();
    daemon.finish();
}

fn group_members(nonce: u32, group: &str, members: &[&str]) -> Frame {
    Frame::GroupMembers {
        nonce,
        group: group.into(),
        view_id: 0,
        members: members.iter().map(|m| m.to_string()).collect(),
    }
}

#[test]
fn members_asks_the_daemon_and_keeps_what_arrives_meanwhile() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        let query = |nonce| Frame::GroupQuery {
            nonce,
            group: "g".into(),
        };
        assert_eq!(peer.read_frame(), query(1));
        // A message queued ahead of the answer.
        peer.send(&message("#b#h", &["h"], b"before"));
        peer.send(&group_members(1, "g", &["#b#h", "#c#k"]));
        // The second query goes unanswered in time; its late answer comes
        // before the next message.
        assert_eq!(peer.read_frame(), query(2));
        assert_eq!(peer.read_frame(), Frame::Join { group: "h".into() });
        peer.send(&group_members(2, "g", &[]));
        peer.send(&message("#b#h", &["h"], b"after"));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "a").unwrap();
    assert_eq!(
        client.members("g", BOUND).unwrap(),
        Some(vec!["#b#h".to_string(), "#c#k".to_string()])
    );
    match client.receive().unwrap() {
        Received::Message(m) => assert_eq!(m.payload, b"before"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        client.members("g", Duration::from_millis(50)).unwrap(),
        None,
        "no answer in time"
    );
    // Names a join refuses are refused here, before anything is sent.
    assert!(matches!(
        client.members("#b#h", BOUND),
        Err(ClientError::Invalid(_))
    ));
    assert!(matches!(
        client.members("", BOUND),
        Err(ClientError::Invalid(_))
    ));
    client.join("h").unwrap();
    // The late answer is not an event.
    match client.receive_timeout(BOUND).unwrap() {
        Some(Received::Message(m)) => assert_eq!(m.payload, b"after"),
        other => panic!("{other:?}"),
    }
    client.disconnect().unwrap();
    daemon.finish();
}

fn delta(view_id: u64, previous: u64, reason: Reason, joined: &[&str], left: &[&str]) -> Frame {
    Frame::MembershipDelta {
        group: "g".into(),
        view_id,
        previous,
        reason,
        transitional: false,
        quorum: true,
        joined: joined.iter().map(|s| s.to_string()).collect(),
        left: left.iter().map(|s| s.to_string()).collect(),
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn membership_deltas_are_received_as_whole_views() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#b#h");
        peer.send(&Frame::Membership {
            group: "g".into(),
            view_id: 3,
            reason: Reason::Join,
            transitional: false,
            quorum: true,
            members: names(&["#a#h", "#b#h"]),
        });
        peer.send(&delta(4, 3, Reason::Join, &["#c#h"], &[]));
        peer.send(&delta(5, 4, Reason::Disconnect, &[], &["#a#h"]));
        // A delta of a view this client never had.
        peer.send(&delta(7, 6, Reason::Join, &["#d#h"], &[]));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    let mut client = Client::connect_to(&daemon.endpoint(), "b").unwrap();
    let view = |id, reason, members: &[&str], joined: &[&str], left: &[&str]| {
        Received::Membership(
            Membership::new("g", id, reason, false, true, names(members))
                .with_changes(names(joined), names(left)),
        )
    };
    assert_eq!(
        client.receive().unwrap(),
        view(3, Reason::Join, &["#a#h", "#b#h"], &["#b#h"], &[])
    );
    assert_eq!(
        client.receive().unwrap(),
        view(4, Reason::Join, &["#a#h", "#b#h", "#c#h"], &["#c#h"], &[])
    );
    let five = client.receive().unwrap();
    assert_eq!(
        five,
        view(5, Reason::Disconnect, &["#b#h", "#c#h"], &[], &["#a#h"])
    );
    match five {
        Received::Membership(v) => assert_eq!(v.disconnected(), ["#a#h"]),
        other => panic!("{other:?}"),
    }
    match client.receive() {
        Err(ClientError::Unexpected(what)) => assert!(what.contains("other than the last")),
        other => panic!("{other:?}"),
    }
    client.disconnect().unwrap();
    daemon.finish();
}
