//! Socket setup: a unicast socket per node and, optionally, an IP multicast
//! receive socket.
//!
//! Multicast scope is a setting ([`MulticastOptions`]): the interface that
//! multicast leaves by and is received on, and the TTL (hop limit). The
//! default pins every socket to loopback: `IP_MULTICAST_IF` = 127.0.0.1,
//! TTL 0, loopback on, membership on 127.0.0.1 only, so nothing leaves the
//! host; tests and demos keep that default. A LAN deployment names the
//! host's address on the LAN (IPv4) or the interface's index (IPv6) and a
//! TTL of at least 1. Groups must be administratively scoped in either
//! case (239.255.0.0/16; IPv6 link-, admin-, site- or organisation-local).
//! Multicast is sent from the unicast socket, so receivers see the sender's
//! unicast address as the source and map it to a `NodeId`.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};

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
    /// Where IP multicast goes. Default: loopback, TTL 0.
    pub multicast: MulticastOptions,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            recv_buffer_bytes: 4 << 20,
            send_buffer_bytes: 4 << 20,
            multicast: MulticastOptions::default(),
        }
    }
}

/// The interface IP multicast is sent by and received on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MulticastInterface {
    /// For IPv4 groups: one of this host's IPv4 addresses
    /// (`IP_MULTICAST_IF`, and the interface of `IP_ADD_MEMBERSHIP`).
    V4(Ipv4Addr),
    /// For IPv6 groups: an interface index (`IPV6_MULTICAST_IF`,
    /// `IPV6_ADD_MEMBERSHIP`).
    V6(u32),
}

/// Scope of a node's IP multicast. The default keeps it on the host:
/// interface 127.0.0.1, TTL 0, loopback on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MulticastOptions {
    /// Default 127.0.0.1.
    pub interface: MulticastInterface,
    /// `IP_MULTICAST_TTL` / `IPV6_MULTICAST_HOPS`: 0 keeps datagrams on the
    /// host, 1 on the link (a LAN without multicast routing). Default 0.
    pub ttl: u32,
}

impl Default for MulticastOptions {
    fn default() -> Self {
        MulticastOptions {
            interface: MulticastInterface::V4(Ipv4Addr::LOCALHOST),
            ttl: 0,
        }
    }
}

/// An administratively scoped multicast group and port: IPv4
/// 239.255.0.0/16, or IPv6 with link-local (2), admin-local (4),
/// site-local (5) or organisation-local (8) scope (`ff02::/16`,
/// `ff04::/16`, `ff05::/16`, `ff08::/16`, any flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MulticastGroup(SocketAddr);

impl MulticastGroup {
    /// Refuses anything outside 239.255.0.0/16, or port 0.
    pub fn new(addr: SocketAddrV4) -> Result<MulticastGroup, NetError> {
        let [a, b, _, _] = addr.ip().octets();
        if (a, b) != (239, 255) || addr.port() == 0 {
            return Err(NetError::GroupNotAdminScoped(addr.into()));
        }
        Ok(MulticastGroup(addr.into()))
    }

    /// Refuses an IPv6 group of interface-local, global or reserved scope,
    /// or port 0.
    pub fn new_v6(addr: SocketAddrV6) -> Result<MulticastGroup, NetError> {
        let [first, flags_scope, ..] = addr.ip().octets();
        let scoped = first == 0xff && matches!(flags_scope & 0x0f, 2 | 4 | 5 | 8);
        if !scoped || addr.port() == 0 {
            return Err(NetError::GroupNotAdminScoped(addr.into()));
        }
        Ok(MulticastGroup(addr.into()))
    }

    /// Either family, checked as by [`MulticastGroup::new`] or
    /// [`MulticastGroup::new_v6`].
    pub fn from_addr(addr: SocketAddr) -> Result<MulticastGroup, NetError> {
        match addr {
            SocketAddr::V4(v4) => MulticastGroup::new(v4),
            SocketAddr::V6(v6) => MulticastGroup::new_v6(v6),
        }
    }

    pub fn addr(&self) -> SocketAddr {
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
        set_multicast_scope(&socket, addr.ip(), &options.multicast)?;
        socket.bind(&addr.into()).map_err(err("bind unicast"))?;
        let unicast: UdpSocket = socket.into();
        let local_addr = unicast.local_addr().map_err(err("local address"))?;
        Ok(Endpoint {
            unicast,
            multicast: None,
            local_addr,
        })
    }

    /// Also receive `group`'s datagrams, on the interface of
    /// `options.multicast` only (loopback by default). Several endpoints of
    /// one host may join the same group (`SO_REUSEADDR`): each gets a copy.
    pub fn join(&mut self, group: MulticastGroup, options: &SocketOptions) -> Result<(), NetError> {
        let addr = group.addr();
        let socket = new_udp(addr)?;
        socket
            .set_reuse_address(true)
            .map_err(err("SO_REUSEADDR"))?;
        set_buffers(&socket, options)?;
        set_multicast_scope(&socket, addr.ip(), &options.multicast)?;
        // Bound to the group address: this socket sees only the group's traffic.
        socket.bind(&addr.into()).map_err(err("bind multicast"))?;
        match (addr.ip(), options.multicast.interface) {
            (IpAddr::V4(ip), MulticastInterface::V4(interface)) => socket
                .join_multicast_v4(&ip, &interface)
                .map_err(err("IP_ADD_MEMBERSHIP"))?,
            (IpAddr::V6(ip), MulticastInterface::V6(index)) => socket
                .join_multicast_v6(&ip, index)
                .map_err(err("IPV6_ADD_MEMBERSHIP"))?,
            _ => return Err(family_mismatch("IP_ADD_MEMBERSHIP")),
        }
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

/// A socket for the IP multicast groups an engine joins and leaves as it
/// runs (QSM's per-region addresses, `Engine::poll_group_change`): bound to
/// the wildcard address of the groups' family at their port, and, on
/// Linux, receiving only the groups it joined itself (`IP_MULTICAST_ALL`
/// off; otherwise a wildcard-bound socket gets every group any socket of
/// the host joined). Joins use the interface of `options.multicast`
/// (loopback by default). Several nodes of one host may bind the same port
/// (`SO_REUSEADDR`): each gets a copy of the groups it joined.
pub fn group_socket(
    first: SocketAddr,
    options: &SocketOptions,
) -> Result<std::net::UdpSocket, NetError> {
    let wildcard: IpAddr = match first {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let addr = SocketAddr::new(wildcard, first.port());
    let socket = new_udp(addr)?;
    socket
        .set_reuse_address(true)
        .map_err(err("SO_REUSEADDR"))?;
    #[cfg(target_os = "linux")]
    match first {
        SocketAddr::V4(_) => socket
            .set_multicast_all_v4(false)
            .map_err(err("IP_MULTICAST_ALL"))?,
        SocketAddr::V6(_) => socket
            .set_multicast_all_v6(false)
            .map_err(err("IPV6_MULTICAST_ALL"))?,
    }
    set_buffers(&socket, options)?;
    socket
        .bind(&addr.into())
        .map_err(err("bind group socket"))?;
    Ok(socket.into())
}

/// Joins (`join`) or leaves `group` on `socket` (from [`group_socket`]) at
/// the interface of `options`.
pub fn change_group(
    socket: &std::net::UdpSocket,
    group: SocketAddr,
    options: &MulticastOptions,
    join: bool,
) -> Result<(), NetError> {
    change_group_ref(socket, group, options, join)
}

/// [`change_group`] on any socket that `socket2` can borrow.
pub(crate) fn change_group_ref<S: std::os::fd::AsFd>(
    socket: &S,
    group: SocketAddr,
    options: &MulticastOptions,
    join: bool,
) -> Result<(), NetError> {
    let socket = socket2::SockRef::from(socket);
    match (group.ip(), options.interface, join) {
        (IpAddr::V4(ip), MulticastInterface::V4(interface), true) => socket
            .join_multicast_v4(&ip, &interface)
            .map_err(err("IP_ADD_MEMBERSHIP")),
        (IpAddr::V4(ip), MulticastInterface::V4(interface), false) => socket
            .leave_multicast_v4(&ip, &interface)
            .map_err(err("IP_DROP_MEMBERSHIP")),
        (IpAddr::V6(ip), MulticastInterface::V6(index), true) => socket
            .join_multicast_v6(&ip, index)
            .map_err(err("IPV6_ADD_MEMBERSHIP")),
        (IpAddr::V6(ip), MulticastInterface::V6(index), false) => socket
            .leave_multicast_v6(&ip, index)
            .map_err(err("IPV6_DROP_MEMBERSHIP")),
        _ => Err(family_mismatch("IP_ADD_MEMBERSHIP")),
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

/// The multicast interface and TTL of `options`, loopback on (several
/// daemons of one host hear each other; a node drops its own datagrams).
/// With the default options whatever this socket multicasts is looped back
/// locally and never routed out. An interface of the other address family
/// than the socket's is refused, except the default on an IPv6 socket
/// (which then keeps its multicast on the host with hops 0).
fn set_multicast_scope(
    socket: &Socket,
    family: IpAddr,
    options: &MulticastOptions,
) -> Result<(), NetError> {
    match (family, options.interface) {
        (IpAddr::V4(_), MulticastInterface::V4(interface)) => {
            socket
                .set_multicast_if_v4(&interface)
                .map_err(err("IP_MULTICAST_IF"))?;
            socket
                .set_multicast_ttl_v4(options.ttl)
                .map_err(err("IP_MULTICAST_TTL"))?;
            socket
                .set_multicast_loop_v4(true)
                .map_err(err("IP_MULTICAST_LOOP"))?;
        }
        (IpAddr::V6(_), MulticastInterface::V6(index)) => {
            socket
                .set_multicast_if_v6(index)
                .map_err(err("IPV6_MULTICAST_IF"))?;
            socket
                .set_multicast_hops_v6(options.ttl)
                .map_err(err("IPV6_MULTICAST_HOPS"))?;
            socket
                .set_multicast_loop_v6(true)
                .map_err(err("IPV6_MULTICAST_LOOP"))?;
        }
        // An IPv6 unicast socket with the default (IPv4 loopback) options:
        // it cannot multicast to an IPv4 group, and no IPv6 group was
        // configured, so there is nothing to pin; hops 0 still keeps any
        // IPv6 multicast on the host.
        (IpAddr::V6(_), MulticastInterface::V4(v4)) if v4.is_loopback() && options.ttl == 0 => {
            socket
                .set_multicast_hops_v6(0)
                .map_err(err("IPV6_MULTICAST_HOPS"))?;
        }
        _ => return Err(family_mismatch("IP_MULTICAST_IF")),
    }
    Ok(())
}

fn family_mismatch(what: &'static str) -> NetError {
    NetError::Socket {
        what,
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            "the multicast interface is of the other address family",
        ),
    }
}

fn err(what: &'static str) -> impl FnOnce(io::Error) -> NetError {
    move |source| NetError::Socket { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    /// A group joined on loopback (TTL 0) receives what a node's unicast
    /// socket sends to it; after leaving, nothing more arrives.
    #[test]
    fn a_group_socket_receives_the_groups_it_joined_until_it_leaves() {
        let options = SocketOptions::default();
        let port = 21_000 + (std::process::id() % 20_000) as u16;
        let group: SocketAddr = SocketAddrV4::new(Ipv4Addr::new(239, 255, 78, 3), port).into();
        let other: SocketAddr = SocketAddrV4::new(Ipv4Addr::new(239, 255, 78, 4), port).into();
        let rx = group_socket(group, &options).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        change_group(&rx, group, &options.multicast, true).unwrap();
        let tx = Endpoint::bind_loopback(&options).unwrap();
        // A group not joined here: not received (IP_MULTICAST_ALL off).
        let stranger = group_socket(other, &options).unwrap();
        change_group(&stranger, other, &options.multicast, true).unwrap();
        tx.unicast.send_to(b"other", other).unwrap();
        tx.unicast.send_to(b"one", group).unwrap();
        let mut buf = [0u8; 64];
        let (n, from) = rx.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"one"[..], tx.local_addr()));
        change_group(&rx, group, &options.multicast, false).unwrap();
        tx.unicast.send_to(b"two", group).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .unwrap();
        assert!(rx.recv_from(&mut buf).is_err(), "received after leaving");
    }

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

    #[test]
    fn only_admin_scoped_ipv6_groups() {
        let group = |text: &str| MulticastGroup::from_addr(text.parse().unwrap());
        for ok in [
            "[ff02::77]:7400",
            "[ff05::1:2]:7400",
            "[ff15::9]:7400",
            "[ff08::1]:7400",
        ] {
            assert!(group(ok).is_ok(), "{ok}");
        }
        for bad in [
            "[ff01::1]:7400",
            "[ff0e::1]:7400",
            "[fe80::1]:7400",
            "[ff05::1]:0",
        ] {
            assert!(group(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_multicast_interface_and_ttl_are_set_as_configured() {
        let options = SocketOptions {
            multicast: MulticastOptions {
                interface: MulticastInterface::V4(Ipv4Addr::LOCALHOST),
                ttl: 3,
            },
            ..SocketOptions::default()
        };
        let endpoint = Endpoint::bind_loopback(&options).unwrap();
        let sock = socket2::SockRef::from(&endpoint.unicast);
        assert_eq!(sock.multicast_ttl_v4().unwrap(), 3);
    }

    #[test]
    fn an_ipv6_socket_binds_with_the_default_options_and_refuses_a_v4_interface_with_ttl() {
        let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, 0));
        let Ok(endpoint) = Endpoint::bind(v6, &SocketOptions::default()) else {
            // No IPv6 on this host (e.g. disabled in a container).
            return;
        };
        let sock = socket2::SockRef::from(&endpoint.unicast);
        assert_eq!(sock.multicast_hops_v6().unwrap(), 0);
        let lan = SocketOptions {
            multicast: MulticastOptions {
                interface: MulticastInterface::V4(Ipv4Addr::new(10, 0, 0, 1)),
                ttl: 1,
            },
            ..SocketOptions::default()
        };
        assert!(Endpoint::bind(v6, &lan).is_err());
    }
}
