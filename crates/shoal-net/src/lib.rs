//! Shoal's runtime: drives a sans-IO engine (`shoal-core`) over real UDP
//! sockets with tokio (DESIGN.md, "The sans-IO contract" and "Pack and batch").
//!
//! One [`Node`] is one member: an OS thread running a current-thread tokio
//! runtime (or, with [`Node::spawn_task`], a task of the caller's runtime)
//! that owns the engine outright (no `Arc<Mutex<Engine>>`), a unicast
//! UDP socket (IPv4 or IPv6, loopback or any address of the host) and, when
//! configured, an IP multicast receive socket on a chosen interface. Its core loop follows QSM's lessons: received datagrams are handled
//! before timers, and timers before new application sends; sockets are drained
//! in batches; the engine packs many messages per datagram and the runtime
//! flushes whenever it runs out of input, so packing adds no latency at low
//! rates.
//!
//! A seeded fault-injection layer ([`Faults`]) drops, duplicates and delays
//! received datagrams and drops or duplicates sent ones, for tests, `shoal
//! demo` and the daemon's `[faults]` section.
//!
//! ```text
//! let clock = Clock::new();
//! let endpoints = (0..n).map(|_| Endpoint::bind_loopback(&SocketOptions::default())).collect();
//! let book = AddressBook::new(endpoints.iter().map(Endpoint::local_addr).collect());
//! let node = Node::spawn(engine, endpoint, NodeConfig::new(book), clock)?;
//! node.commands().send(Command::Multicast(payload)).await?;
//! let batch = node.events().recv().await;          // EventBatch { at, events }
//! let (engine, stats) = node.shutdown()?;          // graceful: returns the engine
//! ```

mod addr;
mod auth;
mod clock;
pub mod daemon;
mod error;
mod faults;
mod gro;
mod gso;
mod node;
pub mod sites;
mod socket;

pub use addr::{AddressBook, Learned};
pub use auth::{
    AuthError, AuthStats, ClusterKey, KeyError, Mode, Opened, Opener, OpenerConfig, SealError,
    Sealer, OVERHEAD,
};
pub use clock::Clock;
pub use error::NetError;
pub use faults::{FaultConfig, Faults, Verdict};
pub use node::{Auth, Command, Control, EventBatch, Node, NodeConfig, RuntimeStats};
pub use socket::{
    change_group, group_socket, Endpoint, MulticastGroup, MulticastInterface, MulticastOptions,
    SocketOptions,
};
