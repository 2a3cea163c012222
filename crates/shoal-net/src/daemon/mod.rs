//! The per-host daemon's runtime: the daemon engine
//! ([`shoal_core::daemon::Daemon`], which decides everything: membership,
//! sessions, groups, services, limits) served on a Unix socket and
//! optionally TCP ([`server`]), configured from TOML ([`config`]), with
//! Prometheus metrics ([`metrics`]).

pub mod config;
pub mod metrics;
pub mod server;

pub use server::{run, DaemonError};
