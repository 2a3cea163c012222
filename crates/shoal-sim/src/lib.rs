//! Shoal's deterministic discrete-event network simulator. It drives the
//! real protocol engines of `shoal-core` (DESIGN.md, "The simulator") over
//! simulated links and routers, so the papers' experiments run at thousands
//! of nodes in seconds, and a seed reproduces a run exactly.

pub mod metrics;
pub mod network;
pub mod queue;
pub mod report;
pub mod scenarios;
pub mod sim;
pub mod swarm;

pub use network::{LinkSpec, Topology};
pub use report::Report;
pub use sim::{ProcessingCost, Sim};
