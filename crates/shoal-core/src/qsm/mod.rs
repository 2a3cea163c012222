//! QuickSilver Scalable Multicast (QSM): many overlapping groups carried by
//! per-region IP multicast with token-ring recovery ([A] Ostrowski, Birman,
//! Phanishayee, "QuickSilver Scalable Multicast"; [B] Ostrowski, Birman,
//! Dolev, "Quicksilver Scalable Multicast"). `docs/qsm.md` describes the
//! engines and their settings.
//!
//! - [`regions`]: groups mapped to regions (nodes with identical group sets).
//! - [`cover`]: cover sets, which split irregular overlap into regular parts.
//! - [`engine`]: one member of one region: partitions, the token, ACK/NAK,
//!   push and pull repair, pull sending ([`Qsm`]).

pub mod config;
pub mod cover;
pub mod engine;
pub mod regions;

#[cfg(test)]
mod tests;

pub use config::{Config, ConfigError};
pub use engine::{Event, GroupState, Memory, MulticastError, Qsm, RegionView, Stats};
pub use regions::{GroupId, Region, RegionId, RegionMap};
