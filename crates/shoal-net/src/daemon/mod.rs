//! The per-host daemon (issue 5, DESIGN.md "What a user sees"): client
//! sessions and lightweight groups ([`core`]) over the daemons' cluster
//! membership and total order (`shoal_core::cluster`), served on a Unix
//! socket and optionally TCP ([`server`]), configured from TOML ([`config`]).

pub mod config;
pub mod core;
pub mod metrics;
pub mod server;

pub use server::{run, DaemonError};
