//! A pbcast member fed arbitrary datagrams from a peer: it must never panic,
//! never break its invariants, and keep answering polls.
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_core::pbcast::{Config, Pbcast};
use shoal_core::{Engine, Instant, NodeId};

fuzz_target!(|data: &[u8]| {
    let members = [NodeId(0), NodeId(1), NodeId(2)];
    let mut engine = Pbcast::new(NodeId(0), &members, Config::default(), 1, Instant::ZERO)
        .expect("default config is valid");
    let _ = engine.multicast(Instant::ZERO, bytes::Bytes::from_static(b"hello"));
    let mut now = Instant::ZERO;
    // Split the input into datagrams at 0xFF 0xFF markers, alternating senders.
    for (i, datagram) in data.split(|b| *b == 0xFF).enumerate() {
        now = Instant::from_nanos(now.as_nanos() + 7_000_000);
        engine.handle_datagram(now, NodeId(1 + (i % 2) as u32), datagram);
        engine.handle_timeout(now);
        while engine.poll_transmit(now).is_some() {}
        while engine.poll_event().is_some() {}
        engine.check_invariants();
    }
});
