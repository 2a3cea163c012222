//! Socket setup: a unicast socket per node and, optionally, an IP multicast
//! receive socket, every one of them pinned to loopback.
//!
//! Multicast safety: every socket that can send or receive multicast has
//! `IP_MULTICAST_IF` = 127.0.0.1, TTL 0 and loopback on, and joins its group
//! on interface 127.0.0.1 only; groups must be admin-scoped
//! (239.255.0.0/16). Nothing leaves through the machine's real interfaces.
//! Multicast is sent from the unicast socket, so receivers see the sender's
//! unicast address as the source and map it to a `NodeId`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};

use socket2::{Domain, Protocol, Socket, Type};

use crate::NetError;

/// Kernel buffer sizes asked for. The kernel caps them (`net.core.rmem_max`,
/// `wmem_max`); the cap is tolerated and the granted size logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketOptions {
    /// `SO_RCVBUF`. Default 4 MiB: at 100,000 1 KB messages/s a member
    /// receives 100 MB/s, and a scheduling hiccup of a few ms must not
    /// overflow the buffer.
    pub recv_buffer_bytes: usize,
    /// `SO_SNDBUF`. Default 4 MiB.
    pub send_buffer_bytes: usize,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            recv_buffer_bytes: 4 << 20,
            send_buffer_bytes: 4 << 20,
        }
    }
}

/// An admin-scoped IPv4 multicast group and port (239.255.0.0/16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MulticastGroup(SocketAddrV4);

impl MulticastGroup {
    /// Refuses anything outside 239.255.0.0/16.
    pub fn new(addr: SocketAddrV4) -> Result<MulticastGroup, NetError> {
        let [a, b, _, _] = addr.ip().octets();
        if (a, b) != (239, 255) || addr.port() == 0 {
            return Err(NetError::GroupNotAdminScoped(addr.into()));
        }
        Ok(MulticastGroup(addr))
    }

    pub fn addr(&self) -> SocketAddrV4 {
        self.0
    }
}

/// A node's bound sockets, not yet handed to a runtime.
#[derive(Debug)]
pub struct Endpoint {
    pub(crate) unicast: UdpSocket,
    pub(crate) multicast: Option<(UdpSocket, MulticastGroup)>,
    local_addr: SocketAddr,
}

impl Endpoint {
    /// A unicast socket on 127.0.0.1 with a port chosen by the kernel.
    pub fn bind_loopback(options: &SocketOptions) -> Result<Endpoint, NetError> {
        Endpoint::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), options)
    }

    /// A unicast socket bound on `addr`.
    pub fn bind(addr: SocketAddr, options: &SocketOptions) -> Result<Endpoint, NetError> {
        let socket = new_udp(addr)?;
        set_buffers(&socket, options)?;
        pin_multicast_to_loopback(&socket)?;
        socket.bind(&addr.into()).map_err(err("bind unicast"))?;
        let unicast: UdpSocket = socket.into();
        let local_addr = unicast.local_addr().map_err(err("local address"))?;
        Ok(Endpoint {
            unicast,
            multicast: None,
            local_addr,
        })
    }

    /// Also receive `group`'s datagrams, on loopback only. Several endpoints
    /// of one host may join the same group (`SO_REUSEADDR`): each gets a copy.
    pub fn join(&mut self, group: MulticastGroup, options: &SocketOptions) -> Result<(), NetError> {
        let addr = SocketAddr::V4(group.addr());
        let socket = new_udp(addr)?;
        socket
            .set_reuse_address(true)
            .map_err(err("SO_REUSEADDR"))?;
        set_buffers(&socket, options)?;
        pin_multicast_to_loopback(&socket)?;
        // Bound to the group address: this socket sees only the group's traffic.
        socket.bind(&addr.into()).map_err(err("bind multicast"))?;
        socket
            .join_multicast_v4(group.addr().ip(), &Ipv4Addr::LOCALHOST)
            .map_err(err("IP_ADD_MEMBERSHIP on 127.0.0.1"))?;
        self.multicast = Some((socket.into(), group));
        Ok(())
    }

    /// Where this node receives unicast (and where its datagrams come from).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The group joined, if any.
    pub fn group(&self) -> Option<MulticastGroup> {
        self.multicast.as_ref().map(|(_, g)| *g)
    }

    /// Granted `SO_RCVBUF` of the unicast socket (Linux reports twice the
    /// usable size).
    pub fn recv_buffer_bytes(&self) -> usize {
        socket2::SockRef::from(&self.unicast)
            .recv_buffer_size()
            .unwrap_or(0)
    }
}

fn new_udp(addr: SocketAddr) -> Result<Socket, NetError> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))
        .map_err(err("socket"))?;
    socket.set_nonblocking(true).map_err(err("O_NONBLOCK"))?;
    Ok(socket)
}

/// Large buffers; a smaller grant (kernel cap) is logged, not an error.
fn set_buffers(socket: &Socket, options: &SocketOptions) -> Result<(), NetError> {
    socket
        .set_recv_buffer_size(options.recv_buffer_bytes)
        .map_err(err("SO_RCVBUF"))?;
    socket
        .set_send_buffer_size(options.send_buffer_bytes)
        .map_err(err("SO_SNDBUF"))?;
    let granted = socket.recv_buffer_size().unwrap_or(0);
    if granted < options.recv_buffer_bytes {
        tracing::debug!(
            asked = options.recv_buffer_bytes,
            granted,
            "SO_RCVBUF capped by the kernel (net.core.rmem_max)"
        );
    }
    Ok(())
}

/// IP_MULTICAST_IF = 127.0.0.1, TTL 0, loopback on: whatever this socket
/// multicasts is looped back locally and never routed out.
fn pin_multicast_to_loopback(socket: &Socket) -> Result<(), NetError> {
    socket
        .set_multicast_if_v4(&Ipv4Addr::LOCALHOST)
        .map_err(err("IP_MULTICAST_IF"))?;
    socket
        .set_multicast_ttl_v4(0)
        .map_err(err("IP_MULTICAST_TTL"))?;
    socket
        .set_multicast_loop_v4(true)
        .map_err(err("IP_MULTICAST_LOOP"))?;
    Ok(())
}

fn err(what: &'static str) -> impl FnOnce(io::Error) -> NetError {
    move |source| NetError::Socket { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_admin_scoped_groups() {
        let ok = SocketAddrV4::new(Ipv4Addr::new(239, 255, 1, 2), 7400);
        assert!(MulticastGroup::new(ok).is_ok());
        for bad in [
            SocketAddrV4::new(Ipv4Addr::new(224, 0, 0, 1), 7400),
            SocketAddrV4::new(Ipv4Addr::new(239, 1, 1, 1), 7400),
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 7400),
            SocketAddrV4::new(Ipv4Addr::new(239, 255, 1, 2), 0),
        ] {
            assert!(MulticastGroup::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn binds_on_loopback_with_pinned_multicast() {
        let endpoint = Endpoint::bind_loopback(&SocketOptions::default()).unwrap();
        assert!(endpoint.local_addr().ip().is_loopback());
        assert_ne!(endpoint.local_addr().port(), 0);
        let sock = socket2::SockRef::from(&endpoint.unicast);
        assert_eq!(sock.multicast_ttl_v4().unwrap(), 0);
        assert_eq!(sock.multicast_if_v4().unwrap(), Ipv4Addr::LOCALHOST);
        assert!(sock.multicast_loop_v4().unwrap());
    }
}
