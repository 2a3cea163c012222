//! A vsync member fed arbitrary datagrams from peers: the committee's
//! primary of a three-member group with k = 2 (so replication, heartbeats,
//! replica acks, view changes and repairs are all live), and the backup in
//! a second engine fed the same input. No panic, the engines' invariants
//! hold after every input, and forged counts or sequence numbers cannot
//! make them allocate without bound.
//!
//! Input: a sequence of chunks `[from, advance_ms, len_hi, len_lo, bytes…]`
//! (so datagrams may hold any byte value, 0xFF included).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_core::vsync::{Config, Vsync};
use shoal_core::{Engine, Instant, NodeId};

fuzz_target!(|data: &[u8]| {
    let members = [NodeId(0), NodeId(1), NodeId(2)];
    let config = Config {
        committee_size: std::num::NonZeroU32::new(2).expect("non-zero"),
        ..Config::default()
    };
    let mut engines: Vec<Vsync> = [NodeId(0), NodeId(1)]
        .iter()
        .map(|me| Vsync::new(*me, &members, config.clone(), 1, Instant::ZERO).expect("valid"))
        .collect();
    let mut now = Instant::ZERO;
    for e in &mut engines {
        let _ = e.multicast(now, bytes::Bytes::from_static(b"hello"));
    }
    let mut rest = data;
    while rest.len() >= 4 {
        let from = NodeId(1 + u32::from(rest[0] % 2));
        let advance = u64::from(rest[1]) * 1_000_000;
        let len = usize::from(u16::from_be_bytes([rest[2], rest[3]])).min(rest.len() - 4);
        let datagram = &rest[4..4 + len];
        rest = &rest[4 + len..];
        now = Instant::from_nanos(now.as_nanos() + advance);
        for (i, e) in engines.iter_mut().enumerate() {
            // A member never receives from itself.
            let from = if from.0 as usize == i {
                NodeId(2)
            } else {
                from
            };
            e.handle_datagram(now, from, datagram);
            if let Some(deadline) = e.poll_timeout() {
                if deadline <= now {
                    e.handle_timeout(now);
                }
            }
            while e.poll_transmit(now).is_some() {}
            while e.poll_event().is_some() {}
            e.check_invariants();
        }
    }
});
