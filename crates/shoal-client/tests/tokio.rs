//! The async client against the same fake daemon (a thread).

#![cfg(feature = "tokio")]

mod common;

use std::time::Duration;

use common::{message, FakeDaemon, BOUND};
use shoal_client::tokio::Client;
use shoal_client::{
    code, ClientError, Endpoint, FlowControl, FrameError, Reason, Received, SendOptions, Service,
};
use shoal_wire::client::Frame;

/// Bounds a whole test: a hang fails instead of blocking the run.
async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("the test took too long")
}

#[tokio::test]
async fn connect_handshake() {
    let daemon = FakeDaemon::unix(|mut peer| {
        let (name, token) = peer.accept("#alice#h1");
        assert_eq!((name.as_str(), token.as_str()), ("alice", ""));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let client = Client::connect_to(&daemon.endpoint(), "alice")
            .await
            .unwrap();
        assert_eq!(client.private_group(), "#alice#h1");
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn connect_refused_with_an_error() {
    let daemon = FakeDaemon::unix(|mut peer| {
        assert!(matches!(peer.read_frame(), Frame::ConnectExt { .. }));
        peer.send(&Frame::Error {
            code: code::AUTH,
            text: "wrong token".into(),
        });
    });
    let result = bounded(Client::connect_to(&daemon.endpoint(), "alice")).await;
    match result {
        Err(ClientError::Daemon { code, text }) => {
            assert_eq!(code, code::AUTH);
            assert_eq!(text, "wrong token");
        }
        other => panic!("expected a daemon error, got {other:?}"),
    }
    daemon.finish();
}

#[tokio::test]
async fn connect_to_no_daemon() {
    let path = std::env::temp_dir().join(format!("shoal-client-none-{}.sock", std::process::id()));
    let result = Client::connect_to(&Endpoint::Unix(path), "alice").await;
    assert!(
        matches!(result, Err(ClientError::Unreachable { .. })),
        "{result:?}"
    );
}

#[tokio::test]
async fn tcp_sends_the_token() {
    let (daemon, addr) = FakeDaemon::tcp(|mut peer| {
        let (_, token) = peer.accept("#bob#h1");
        assert_eq!(token, "s3cret");
        peer.send(&message("#x#h", &["g"], b"over tcp"));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let endpoint = Endpoint::Tcp {
            addr,
            token: "s3cret".into(),
        };
        let mut client = Client::connect_to(&endpoint, "bob").await.unwrap();
        match client.receive().await.unwrap() {
            Received::Message(m) => assert_eq!(m.payload, b"over tcp"),
            other => panic!("{other:?}"),
        }
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn requests_arrive_encoded() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        assert_eq!(peer.read_frame(), Frame::Join { group: "g1".into() });
        assert_eq!(
            peer.read_frame(),
            Frame::Multicast {
                service: Service::Reliable,
                groups: vec!["g1".into(), "g2".into()],
                payload: b"to both".to_vec(),
            }
        );
        assert_eq!(
            peer.read_frame(),
            Frame::Multicast {
                service: Service::Probabilistic,
                groups: vec!["g1".into()],
                payload: vec![0x5a; 1 << 20],
            }
        );
        assert_eq!(peer.read_frame(), Frame::Leave { group: "g1".into() });
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        client.join("g1").await.unwrap();
        client
            .multicast(Service::Reliable, &["g1", "g2"], b"to both")
            .await
            .unwrap();
        assert!(matches!(
            client.leave("").await,
            Err(ClientError::Invalid(_))
        ));
        client
            .multicast(Service::Probabilistic, &["g1"], &vec![0x5a; 1 << 20])
            .await
            .unwrap();
        client.leave("g1").await.unwrap();
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn messages_and_views_are_received() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        peer.send(&Frame::Membership {
            group: "g".into(),
            view_id: 9,
            reason: Reason::Leave,
            transitional: false,
            quorum: true,
            members: vec!["#a#h".into()],
        });
        peer.send(&Frame::Membership {
            group: "g".into(),
            view_id: 10,
            reason: Reason::Disconnect,
            transitional: false,
            quorum: true,
            members: vec!["#c#h".into()],
        });
        let mut both = message("#b#h", &["g", "h"], b"one").to_vec().unwrap();
        both.extend(message("#b#h", &["g"], b"two").to_vec().unwrap());
        peer.send_raw(&both);
        peer.send(&message("#b#h", &["g"], &vec![3; 1 << 20]));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        match client.receive().await.unwrap() {
            Received::Membership(v) => {
                assert_eq!(v.group, "g");
                assert_eq!(v.view_id, 9);
                assert_eq!(v.reason, Reason::Leave);
                assert_eq!(v.members, vec!["#a#h".to_string()]);
                assert_eq!(v.joined(), ["#a#h".to_string()]);
                assert!(v.left().is_empty());
            }
            other => panic!("{other:?}"),
        }
        // The changes are the library's: computed from the two lists.
        match client.receive().await.unwrap() {
            Received::Membership(v) => {
                assert_eq!(v.joined(), ["#c#h".to_string()]);
                assert_eq!(v.left(), ["#a#h".to_string()]);
                assert_eq!(v.disconnected(), ["#a#h".to_string()]);
                assert!(v.partitioned().is_empty());
            }
            other => panic!("{other:?}"),
        }
        match client.receive().await.unwrap() {
            Received::Message(m) => {
                assert_eq!(m.sender, "#b#h");
                assert_eq!(m.service, Service::Agreed);
                assert_eq!(m.groups, vec!["g".to_string(), "h".to_string()]);
                assert_eq!(m.payload, b"one");
            }
            other => panic!("{other:?}"),
        }
        match client.receive().await.unwrap() {
            Received::Message(m) => assert_eq!(m.payload, b"two"),
            other => panic!("{other:?}"),
        }
        match client.receive().await.unwrap() {
            Received::Message(m) => assert_eq!(m.payload, vec![3; 1 << 20]),
            other => panic!("{other:?}"),
        }
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn a_frame_in_many_small_writes_is_reassembled() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        let small = message("#b#h", &["g"], b"slowly").to_vec().unwrap();
        peer.send_in_pieces(&small, 1, Duration::from_millis(2));
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        let large = message("#b#h", &["g"], &payload).to_vec().unwrap();
        peer.send_in_pieces(&large, 999, Duration::ZERO);
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        match client.receive().await.unwrap() {
            Received::Message(m) => assert_eq!(m.payload, b"slowly"),
            other => panic!("{other:?}"),
        }
        match client.receive().await.unwrap() {
            Received::Message(m) => {
                let want: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
                assert_eq!(m.payload, want);
            }
            other => panic!("{other:?}"),
        }
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn eof_and_disconnect_are_disconnected() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        assert!(matches!(
            client.receive().await,
            Err(ClientError::Disconnected)
        ));
    })
    .await;
    daemon.finish();

    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        peer.send(&Frame::Disconnect);
        assert_eq!(peer.try_read_frame(), None);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        assert!(matches!(
            client.receive().await,
            Err(ClientError::Disconnected)
        ));
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn daemon_errors_come_from_receive_and_disconnect() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        assert!(matches!(peer.read_frame(), Frame::Leave { .. }));
        peer.send(&Frame::Error {
            code: code::BAD_GROUP,
            text: "not a member of g".into(),
        });
        peer.send(&message("#b#h", &["h"], b"still here"));
        assert!(matches!(peer.read_frame(), Frame::Multicast { .. }));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
        peer.send(&Frame::Error {
            code: code::UNSUPPORTED_SERVICE,
            text: "no safe".into(),
        });
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        client.leave("g").await.unwrap();
        let e = client.receive().await.unwrap_err();
        assert_eq!(e.code(), Some(code::BAD_GROUP));
        assert!(matches!(client.receive().await, Ok(Received::Message(_))));
        client.multicast(Service::Safe, &["h"], b"x").await.unwrap();
        let e = client.disconnect().await.unwrap_err();
        assert_eq!(e.code(), Some(code::UNSUPPORTED_SERVICE));
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn garbage_is_a_protocol_error() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        // A frame of an unknown type.
        peer.send_raw(&[0, 0, 0, 2, 2, 200]);
        assert_eq!(peer.try_read_frame(), None);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        match client.receive().await {
            Err(ClientError::Protocol(FrameError::UnknownType(200))) => {}
            other => panic!("expected a protocol error, got {other:?}"),
        }
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn receive_timeout_returns_none_on_silence_and_loses_nothing() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        let frame = message("#b#h", &["g"], b"after the join").to_vec().unwrap();
        peer.send_raw(&frame[..9]);
        assert_eq!(peer.read_frame(), Frame::Join { group: "g".into() });
        peer.send_raw(&frame[9..]);
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        assert_eq!(
            client
                .receive_timeout(Duration::from_millis(50))
                .await
                .unwrap(),
            None
        );
        // A receive that loses a select! race drops no bytes either.
        tokio::select! {
            r = client.receive() => panic!("nothing was sent yet: {r:?}"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        client.join("g").await.unwrap();
        match client.receive_timeout(BOUND).await.unwrap() {
            Some(Received::Message(m)) => assert_eq!(m.payload, b"after the join"),
            other => panic!("{other:?}"),
        }
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn split_halves_in_two_tasks() {
    const N: usize = 200;
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
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
    bounded(async {
        let client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        let (mut send, mut recv) = client.split();
        assert_eq!(send.private_group(), "#a#h");
        assert_eq!(recv.private_group(), "#a#h");
        let receiver = tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                match recv.receive().await {
                    Ok(Received::Message(m)) => got.push(m.payload),
                    Err(ClientError::Disconnected) => return got,
                    other => panic!("{other:?}"),
                }
            }
        });
        for i in 0..N {
            send.multicast(Service::Fifo, &["g"], i.to_string().as_bytes())
                .await
                .unwrap();
        }
        send.disconnect().await.unwrap();
        let got = receiver.await.unwrap();
        let want: Vec<Vec<u8>> = (0..N).map(|i| i.to_string().into_bytes()).collect();
        assert_eq!(got, want);
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn a_batch_arrives_as_consecutive_multicasts() {
    let payloads: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; 3000]).collect();
    let expected = payloads.clone();
    let daemon = FakeDaemon::unix(move |mut peer| {
        peer.accept("#a#h");
        for payload in expected {
            assert_eq!(
                peer.read_frame(),
                Frame::Multicast {
                    service: Service::Agreed,
                    groups: vec!["g1".into(), "g2".into()],
                    payload,
                }
            );
        }
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        client
            .multicast_batch(Service::Agreed, &["g1", "g2"], &payloads)
            .await
            .unwrap();
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

/// As the blocking test: a daemon that does not read makes `try_multicast`
/// report back-pressure (without waiting); once it reads, everything
/// accepted arrives whole and in order, the options in the frames.
#[tokio::test]
async fn try_multicast_reports_back_pressure_and_loses_nothing() {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<usize>();
    let daemon = FakeDaemon::unix(move |mut peer| {
        peer.accept("#a#n5");
        let accepted = go_rx.recv().unwrap();
        for i in 0..accepted {
            match peer.read_frame() {
                Frame::MulticastExt {
                    payload,
                    flags: 1,
                    mess_type: 4,
                    ..
                } => assert_eq!(&payload[..8], &(i as u64).to_be_bytes()),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        assert_eq!((client.name(), client.daemon()), ("a", "n5"));
        let opts = SendOptions {
            self_discard: true,
            mess_type: 4,
        };
        let mut accepted = 0usize;
        let mut payload = vec![0u8; 10_000];
        loop {
            payload[..8].copy_from_slice(&(accepted as u64).to_be_bytes());
            match client.try_multicast(Service::Fifo, &["g"], &payload, opts) {
                Ok(()) => accepted += 1,
                Err(ClientError::WouldBlock) => break,
                Err(e) => panic!("{e}"),
            }
            assert!(accepted < 100_000, "the socket never filled");
        }
        assert!(matches!(
            client.flow_control().unwrap(),
            FlowControl::Blocked { pending_bytes } if pending_bytes > 0
        ));
        go_tx.send(accepted).unwrap();
        client.flush().await.unwrap();
        assert_eq!(client.flow_control().unwrap(), FlowControl::Clear);
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn flow_control_state_asks_the_daemon_and_keeps_what_arrives_meanwhile() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        assert_eq!(peer.read_frame(), Frame::FlowQuery { nonce: 1 });
        peer.send(&message("#b#h", &["g"], b"before"));
        peer.send(&Frame::FlowState {
            nonce: 1,
            accepting: false,
            held_messages: 2,
            held_bytes: 20,
            queued_bytes: 50,
            queue_limit: 1000,
        });
        assert_eq!(peer.read_frame(), Frame::FlowQuery { nonce: 2 });
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        let state = client
            .flow_control_state(Duration::from_secs(20))
            .await
            .unwrap();
        let flow = state.daemon.expect("answered");
        assert!(!flow.accepting);
        assert_eq!(
            (
                flow.held_messages,
                flow.held_bytes,
                flow.queued_bytes,
                flow.queue_limit
            ),
            (2, 20, 50, 1000)
        );
        match client.receive().await.unwrap() {
            Received::Message(m) => assert_eq!(m.payload, b"before"),
            other => panic!("{other:?}"),
        }
        let state = client
            .flow_control_state(Duration::from_millis(50))
            .await
            .unwrap();
        assert_eq!(state.daemon, None);
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}

#[tokio::test]
async fn members_asks_the_daemon_and_keeps_what_arrives_meanwhile() {
    let daemon = FakeDaemon::unix(|mut peer| {
        peer.accept("#a#h");
        let query = |nonce| Frame::GroupQuery {
            nonce,
            group: "g".into(),
        };
        assert_eq!(peer.read_frame(), query(1));
        peer.send(&message("#b#h", &["h"], b"before"));
        peer.send(&Frame::GroupMembers {
            nonce: 1,
            group: "g".into(),
            view_id: 0,
            members: vec!["#b#h".into(), "#c#k".into()],
        });
        assert_eq!(peer.read_frame(), query(2));
        assert_eq!(peer.read_frame(), Frame::Join { group: "h".into() });
        // The late answer to the second query, then a message.
        peer.send(&Frame::GroupMembers {
            nonce: 2,
            group: "g".into(),
            view_id: 0,
            members: Vec::new(),
        });
        peer.send(&message("#b#h", &["h"], b"after"));
        assert_eq!(peer.read_frame(), Frame::Disconnect);
    });
    bounded(async {
        let mut client = Client::connect_to(&daemon.endpoint(), "a").await.unwrap();
        let members = client.members("g", Duration::from_secs(20)).await.unwrap();
        assert_eq!(members, Some(vec!["#b#h".to_string(), "#c#k".to_string()]));
        match client.receive().await.unwrap() {
            Received::Message(m) => assert_eq!(m.payload, b"before"),
            other => panic!("{other:?}"),
        }
        let late = client.members("g", Duration::from_millis(50)).await;
        assert_eq!(late.unwrap(), None, "no answer in time");
        assert!(matches!(
            client.members("#b#h", Duration::from_secs(1)).await,
            Err(ClientError::Invalid(_))
        ));
        client.join("h").await.unwrap();
        // The late answer is not an event.
        match client.receive().await.unwrap() {
            Received::Message(m) => assert_eq!(m.payload, b"after"),
            other => panic!("{other:?}"),
        }
        client.disconnect().await.unwrap();
    })
    .await;
    daemon.finish();
}
