//! Shoal's protocol engines, written sans-IO (DESIGN.md, "The sans-IO contract").
//!
//! An engine is a plain state machine. The caller hands it the time and the
//! bytes that arrived; it hands back datagrams to send, events to deliver and
//! the next time it wants to be woken. It never reads a clock, opens a socket,
//! spawns a task or draws from a global random number generator, so the real
//! runtime (`shoal-net`) and the simulator (`shoal-sim`) drive the same code,
//! and a seeded run is reproducible bit for bit.
//!
//! Driving an engine (the order matters: every input is followed by a full
//! drain of the outputs):
//!
//! ```text
//! engine.handle_datagram(now, from, &bytes);   // a datagram arrived
//! engine.handle_timeout(now);                  // poll_timeout's deadline passed
//! engine.multicast(now, payload)?;             // the application sends
//! while let Some(t) = engine.poll_transmit(now) { /* send t */ }
//! while let Some(ev) = engine.poll_event() { /* deliver ev */ }
//! let next = engine.poll_timeout();
//! ```

pub mod daemon;
pub mod engine;
pub mod fd;
pub mod fragments;
pub mod hop;
pub mod overlay;
pub mod pbcast;
pub mod qsm;
pub mod ranges;
pub mod ring;
pub mod sites;
pub mod srm;
pub mod time;
pub mod traditional;
pub mod vsync;

#[cfg(test)]
pub(crate) mod testnet;

/// Durations in TOML/serde as integer milliseconds.
pub(crate) mod serde_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

pub use engine::{Destination, Engine, GroupChange, GroupTransmit, NodeId, Transmit};
pub use time::Instant;
