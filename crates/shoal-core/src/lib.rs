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

pub mod engine;
pub mod pbcast;
pub mod ranges;
pub mod time;

pub use engine::{Destination, Engine, NodeId, Transmit};
pub use time::Instant;
