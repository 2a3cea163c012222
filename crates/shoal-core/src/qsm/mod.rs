//! QuickSilver Scalable Multicast (QSM): many overlapping groups carried by
//! per-region IP multicast with token-ring recovery ([A] Ostrowski, Birman,
//! Phanishayee, "QuickSilver Scalable Multicast"; [B] Ostrowski, Birman,
//! Dolev, "Quicksilver Scalable Multicast"). `docs/qsm.md` describes the
//! engines and their settings.
//!
//! - [`regions`]: groups mapped to regions (nodes with identical group sets).
//! - [`cover`]: cover sets, which split irregular overlap into regular parts.

pub mod cover;
pub mod regions;
