//! The per-host daemon (issue 5, DESIGN.md "What a user sees").
//!
//! Built so far: only its configuration ([`config`]). The daemon's sessions,
//! client socket, inter-daemon dissemination and shutdown are not built yet.

pub mod config;
pub mod core;
