//! The daemon engine alone: one daemon founds its group and serves clients.

use std::time::Duration;

use super::*;
use crate::vsync;

const MS: u64 = 1_000_000;

fn lone_daemon() -> Daemon {
    let config = membership::Config::default();
    let batch_max = config.vsync.max_payload();
    let m = Membership::new(0, 1, 1, config, 7, Instant::ZERO).expect("config");
    Daemon::new(Settings::new("d0", Limits::default(), batch_max), m)
}

/// Runs the daemon's timers until `until` (no datagrams: a lone daemon).
fn run_until(d: &mut Daemon, now: &mut Instant, until: Instant) -> Vec<DaemonEvent> {
    let mut out = Vec::new();
    loop {
        while d.poll_transmit(*now).is_some() {}
        while let Some(ev) = d.poll_event() {
            out.push(ev);
        }
        match d.poll_timeout() {
            Some(t) if t <= until => {
                *now = (*now).max(t);
                d.handle_timeout(*now);
            }
            _ => break,
        }
    }
    *now = until;
    out
}

fn frames(events: &[DaemonEvent], id: SessionId) -> Vec<Frame> {
    let mut all = Vec::new();
    for ev in events {
        let bytes = match ev {
            DaemonEvent::Frames(i, b) if *i == id => b.clone(),
            DaemonEvent::Close(i, Some(b)) if *i == id => b.clone(),
            _ => continue,
        };
        let mut rest = &bytes[..];
        while let Ok(Some((f, n))) = shoal_wire::client::decode(rest, &Default::default()) {
            all.push(f);
            rest = &rest[n..];
        }
    }
    all
}

#[test]
fn a_lone_daemon_founds_serves_and_stops_at_once() {
    let mut d = lone_daemon();
    let mut now = Instant::ZERO;
    run_until(&mut d, &mut now, Instant::from_nanos(3_000 * MS));
    assert!(d.membership().is_member(), "founded its group");
    d.handle_client(now, ClientInput::Opened { id: 1, tcp: false });
    d.handle_client(
        now,
        ClientInput::Frame(
            1,
            Frame::Connect {
                name: "a".into(),
                token: String::new(),
            },
        ),
    );
    d.handle_client(
        now,
        ClientInput::Frame(1, Frame::Join { group: "g".into() }),
    );
    d.handle_client(
        now,
        ClientInput::Frame(
            1,
            Frame::Multicast {
                service: shoal_wire::client::Service::Agreed,
                groups: vec!["g".into()],
                payload: b"hi".to_vec(),
            },
        ),
    );
    let events = run_until(&mut d, &mut now, Instant::from_nanos(3_100 * MS));
    let got = frames(&events, 1);
    assert!(matches!(got[0], Frame::ConnectOk { .. }), "{got:?}");
    assert!(
        got.iter().any(|f| matches!(f, Frame::Membership { .. })),
        "{got:?}"
    );
    assert!(
        got.iter()
            .any(|f| matches!(f, Frame::Message { payload, .. } if payload == b"hi")),
        "{got:?}"
    );
    let start = now;
    d.begin_shutdown(now);
    let events = run_until(&mut d, &mut now, start + Duration::from_secs(10));
    let stopped_at = events
        .iter()
        .position(|e| *e == DaemonEvent::Stopped)
        .expect("stopped");
    assert!(d.is_stopped());
    assert_eq!(d.stats().shutdown_steps_timed_out, 0, "no step timed out");
    let _ = stopped_at;
    let _ = vsync::Config::default();
}

#[test]
fn a_connection_that_never_connects_is_closed() {
    let mut d = lone_daemon();
    let mut now = Instant::ZERO;
    run_until(&mut d, &mut now, Instant::from_nanos(3_000 * MS));
    d.handle_client(now, ClientInput::Opened { id: 5, tcp: true });
    let events = run_until(&mut d, &mut now, Instant::from_nanos(20_000 * MS));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, DaemonEvent::Close(5, Some(_)))),
        "{events:?}"
    );
    assert_eq!(d.stats().connect_timeouts, 1);
    assert_eq!(d.connections(), 0);
}

#[test]
fn a_client_that_never_reads_is_cut_at_its_queue_limit() {
    let config = membership::Config::default();
    let batch_max = config.vsync.max_payload();
    let m = Membership::new(0, 1, 1, config, 7, Instant::ZERO).expect("config");
    let limits = Limits {
        client_queue: 64 * 1024,
        ..Limits::default()
    };
    let mut d = Daemon::new(Settings::new("d0", limits, batch_max), m);
    let mut now = Instant::ZERO;
    run_until(&mut d, &mut now, Instant::from_nanos(3_000 * MS));
    d.handle_client(now, ClientInput::Opened { id: 1, tcp: false });
    let connect = Frame::Connect {
        name: "a".into(),
        token: String::new(),
    };
    d.handle_client(now, ClientInput::Frame(1, connect));
    let mut closed = false;
    for _ in 0..10_000 {
        d.handle_client(now, ClientInput::Frame(1, Frame::Status));
        let events = {
            let at = now;
            run_until(&mut d, &mut now, at)
        };
        if events.iter().any(|e| matches!(e, DaemonEvent::Close(1, _))) {
            closed = true;
            break;
        }
        d.check_invariants();
    }
    assert!(closed, "status replies count against the queue");
    assert_eq!(d.client_queue_bytes(), 0);
}
