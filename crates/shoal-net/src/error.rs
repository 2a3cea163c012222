//! Errors of the runtime. Bytes from the network never produce one: bad or
//! foreign datagrams are counted and dropped (STYLE.md, "Errors").

use std::io;
use std::net::SocketAddr;

/// Why a node could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A socket could not be created, configured or bound. The node did not start.
    #[error("socket setup ({what}): {source}")]
    Socket {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The address book does not contain this node's own address, or maps
    /// two members to one address. The node did not start.
    #[error("address book: {0}")]
    AddressBook(String),
    /// Only administratively scoped multicast groups with a port are
    /// accepted: IPv4 239.255.0.0/16, IPv6 link-, admin-, site- or
    /// organisation-local (`socket::MulticastGroup`). The node did not start.
    #[error("multicast group {0} is not administratively scoped (239.255.0.0/16, or IPv6 ff02/ff04/ff05/ff08) with a port")]
    GroupNotAdminScoped(SocketAddr),
    /// The node's thread or runtime could not be started.
    #[error("runtime: {0}")]
    Runtime(#[source] io::Error),
    /// A socket failed while the node ran. The node stopped.
    #[error("socket I/O: {0}")]
    Io(#[source] io::Error),
    /// Authentication could not be set up (e.g. an epoch out of range).
    #[error("authentication: {0}")]
    Auth(String),
    /// The node's thread panicked.
    #[error("node thread panicked")]
    Panicked,
}
