//! Named experiments, one per file (`shoal sim <name>`).

pub mod pbcast_star;
pub mod pbcast_tree;

use shoal_core::pbcast::Config;

/// Names `shoal sim` accepts.
pub const NAMES: [&str; 2] = ["pbcast-star", "pbcast-tree"];

/// pbcast as the papers simulate it: IP multicast first phase, fixed-rate
/// sender (no flow control), Ethernet-sized datagrams.
pub fn paper_pbcast() -> Config {
    Config {
        ip_multicast: true,
        send_window: None,
        max_datagram_size: 1472,
        ..Config::default()
    }
}

/// Seconds to nanoseconds.
pub(crate) fn ns(seconds: f64) -> u64 {
    (seconds * 1e9) as u64
}

/// Simulated time after the last message for repair to finish: past the
/// point where a gap is declared lost (`lost_after_rounds`), with margin.
pub(crate) fn drain_ns(config: &Config) -> u64 {
    let rounds = u64::from(config.lost_after_rounds.get()) + 10;
    config.gossip_interval.as_nanos() as u64 * rounds
}
