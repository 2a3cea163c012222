//! A ring member fed arbitrary datagrams: no panic; forged tokens and
//! messages are taken or dropped without breaking delivery order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_core::ring::{Config, Event, Ring};
use shoal_core::{Engine, Instant, NodeId};

fuzz_target!(|data: &[u8]| {
    let members = [NodeId(0), NodeId(1), NodeId(2)];
    let mut ring = Ring::new(Config::default(), NodeId(1), &members, 7, Instant::ZERO)
        .expect("valid ring");
    let _ = ring.multicast(Instant::ZERO, bytes::Bytes::from_static(b"hello"));
    let mut now = Instant::ZERO;
    let mut last = 0;
    for datagram in data.split(|b| *b == 0xFF) {
        now = Instant::from_nanos(now.as_nanos() + 7_000_000);
        ring.handle_datagram(now, NodeId(0), datagram);
        if ring.poll_timeout().is_some_and(|t| t <= now) {
            ring.handle_timeout(now);
        }
        while ring.poll_transmit(now).is_some() {}
        while let Some(Event::Deliver { seq, .. }) = ring.poll_event() {
            assert_eq!(seq, last + 1, "delivery in sequence order");
            last = seq;
        }
    }
});
