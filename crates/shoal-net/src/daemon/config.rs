//! The daemon's TOML configuration (`shoal daemon --config shoal.toml`).
//!
//! Unknown keys are refused (`deny_unknown_fields`), and a parse error names
//! the offending key; [`DaemonConfig::load`] names the file too. Every
//! setting has a default; an empty file is valid (a single daemon on
//! loopback).
//!
//! ```toml
//! node = "a"
//! socket = "/tmp/shoal-a.sock"      # default: $XDG_RUNTIME_DIR/shoal.sock, else /tmp/shoal-<uid>.sock
//! listen = "10.0.0.1:4804"          # daemon's UDP address for peer daemons (IPv4, IPv6 or a host name)
//! peers = ["10.0.0.2:4804", "host-c:4804"]
//! multicast = "239.255.77.1:9100"   # optional: pbcast's first phase by IP multicast
//! max_datagram = 1472               # default: 1472 (IPv6 1452) beyond loopback, 65507 on loopback
//! engine_datagram = 16384           # default: 16384 beyond loopback (sent in fragments of max_datagram)
//!
//! # Or, instead of `peers`, find the other daemons by IP multicast:
//! # discovery = "239.255.77.1:9100"  # admin-scoped group with a port;
//! #                                  # if `multicast` is set too, the same address
//! # slot = 0                         # required with `discovery`: 0..=255, unique in the cluster
//!
//! [ip_multicast]                    # the sockets of `multicast` and `discovery`
//! interface = "10.0.0.1"            # IPv4: this host's address on the LAN; IPv6: interface name or index
//! ttl = 1                           # default 0 (with interface 127.0.0.1: nothing leaves the host)
//!
//! [auth]                            # required beyond loopback (or `insecure_no_auth = true`)
//! key_file = "/etc/shoal/cluster.key"
//!
//! [tcp]                             # optional
//! address = "10.0.0.1:4803"
//! token = "secret"
//!
//! [limits]
//! clients = 1024
//! groups_per_client = 256
//! group_name_len = 128
//! message_size = 1048576
//! client_queue = 33554432          # bytes
//!
//! [faults]                          # test aid only: off unless present
//! loss = 0.02                       # also duplicate, delay_ms, jitter_ms, send_loss, send_duplicate, seed
//! ```
//!
//! Host names (in `listen`, `peers`, `tcp.address`, `metrics.address`) are
//! resolved once, when the file is parsed, with the system's resolver
//! ([`SystemResolver`]): the first address, and for `peers` the first of
//! `listen`'s family. A daemon does not follow a name that later moves.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use crate::{FaultConfig, MulticastInterface, MulticastOptions, SocketOptions};

use serde::Deserialize;
use thiserror::Error;

/// Why a configuration was refused. The daemon does not start.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file (or `auth.key_file`) could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// Not TOML, an unknown key, or a value of the wrong type; the message
    /// shows the key and its line.
    #[error("invalid configuration: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value that parses but breaks a rule of `key`.
    #[error("invalid configuration: `{key}` {why}")]
    Invalid { key: &'static str, why: String },
    /// A host name (or, in `ip_multicast.interface`, an interface name)
    /// that did not resolve.
    #[error("invalid configuration: `{key}`: cannot resolve {name:?}: {why}")]
    Resolve {
        key: &'static str,
        name: String,
        why: String,
    },
    /// A socket the settings ask for could not be set up (an address not
    /// of this host, a port in use, an interface without multicast).
    #[error("`{key}` ({value}): {source}")]
    Socket {
        key: &'static str,
        value: String,
        source: crate::NetError,
    },
    /// Any of the above, in the file `path` ([`DaemonConfig::load`]).
    #[error("{}: {error}", path.display())]
    File {
        path: PathBuf,
        error: Box<ConfigError>,
    },
}

/// Turns the names in a configuration into addresses. [`SystemResolver`]
/// asks the system; tests give their own.
pub trait Resolve {
    /// The addresses of `host_port` ("name:port", "[v6 name]:port").
    fn host(&self, host_port: &str) -> io::Result<Vec<SocketAddr>>;
    /// The index of the network interface `name` (e.g. "eth0").
    fn interface(&self, name: &str) -> io::Result<u32>;
}

/// Host names by `std::net::ToSocketAddrs` (getaddrinfo: `/etc/hosts`,
/// DNS, ...), interface names by `/sys/class/net/<name>/ifindex` (Linux).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn host(&self, host_port: &str) -> io::Result<Vec<SocketAddr>> {
        Ok(host_port.to_socket_addrs()?.collect())
    }

    fn interface(&self, name: &str) -> io::Result<u32> {
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not an interface name",
            ));
        }
        let path = PathBuf::from("/sys/class/net").join(name).join("ifindex");
        let text = std::fs::read_to_string(&path).map_err(|e| {
            io::Error::new(e.kind(), format!("no interface ({}: {e})", path.display()))
        })?;
        text.trim().parse().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
    }
}

/// Largest UDP payload on loopback (and any IPv4 path without
/// fragmentation limits): 65,535 - 20 (IPv4) - 8 (UDP).
pub const LOOPBACK_DATAGRAM: usize = 65_507;
/// Largest UDP payload in one 1500-byte Ethernet frame over IPv4:
/// 1500 - 20 - 8.
pub const ETHERNET_DATAGRAM_V4: usize = 1_472;
/// The same over IPv6: 1500 - 40 - 8.
pub const ETHERNET_DATAGRAM_V6: usize = 1_452;
/// The engines' datagram size beyond loopback unless set
/// (`engine_datagram`): 11 or 12 Ethernet-sized fragments.
pub const LAN_ENGINE_DATAGRAM: usize = 16_384;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// This daemon's name (shown to clients and in `shoal status`).
    #[serde(default = "default_node")]
    pub node: String,
    /// Path of the client Unix socket (created with mode 0600).
    #[serde(default = "default_socket")]
    pub socket: PathBuf,
    /// UDP address this daemon uses to talk to its peer daemons: any
    /// specific IPv4 or IPv6 address of this host (not 0.0.0.0 or `::`:
    /// peers know a daemon by the address its datagrams come from), or a
    /// host name resolved at start-up. Default 127.0.0.1:4804.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The static set of peer daemons' UDP addresses, of `listen`'s address
    /// family (addresses or host names, resolved at start-up).
    #[serde(default)]
    pub peers: Vec<SocketAddr>,
    /// The transport of pbcast's first phase: unset, unicast (a relay tree,
    /// `relay_fanout`); set, IP multicast to this group, an administratively
    /// scoped address with a port (IPv4 239.255.0.0/16, or IPv6 `ff02::`,
    /// `ff04::`, `ff05::`, `ff08::`), of `listen`'s family. Its scope is
    /// `[ip_multicast]` (default: loopback, TTL 0, nothing leaves the host).
    #[serde(default)]
    pub multicast: Option<SocketAddr>,
    /// Find the peer daemons by IP multicast to this group (checked like
    /// `multicast`, scoped by `[ip_multicast]`) instead of a static `peers`
    /// list, which must then be empty. Needs `slot`; if `multicast` is set
    /// too it must be the same address (a node has one group). Does not by
    /// itself move pbcast's first phase to IP multicast.
    #[serde(default)]
    pub discovery: Option<SocketAddr>,
    /// Interface and TTL of the `multicast` / `discovery` sockets.
    #[serde(default)]
    pub ip_multicast: IpMulticastConfig,
    /// Largest UDP payload this daemon sends, authentication envelope
    /// included: the path's, so that no datagram is fragmented by IP.
    /// Default [`ETHERNET_DATAGRAM_V4`] (1,472; [`ETHERNET_DATAGRAM_V6`],
    /// 1,452, when `listen` is IPv6) when any address is beyond loopback,
    /// else [`LOOPBACK_DATAGRAM`] (65,507). The engines pack messages up to
    /// it and fragment larger ones (`cluster.vsync.pbcast.max_datagram_size`
    /// is set to this minus the envelope, `crate::OVERHEAD` bytes, unless
    /// given, when it must fit). Between 158 and 65,507.
    #[serde(default)]
    pub max_datagram: Option<usize>,
    /// Largest datagram the daemons' engines build. The protocol's costs
    /// (a batch's ordering, replication and acknowledgement, a pbcast
    /// message) are paid per engine datagram, and a batch of client
    /// messages fills one, so larger ones carry many messages for the cost
    /// of one. One larger than `max_datagram` goes as fragments of
    /// `max_datagram` bytes that the receiving daemon puts together
    /// (`shoal_core::fragments`); a lost fragment loses the whole datagram,
    /// which the protocol repairs as any loss, so on a lossy path smaller
    /// is safer. Default [`LAN_ENGINE_DATAGRAM`] (16,384) beyond loopback
    /// (or `max_datagram` if larger), `max_datagram` on loopback. Between
    /// 158 and 65,507.
    #[serde(default)]
    pub engine_datagram: Option<usize>,
    /// Run beyond loopback without `[auth]`. Without a cluster key any host
    /// that can reach `listen` can forge datagrams: one forged datagram can
    /// evict a daemon or inject messages. Default false: a daemon whose
    /// `listen` (or multicast interface) is beyond loopback refuses to start
    /// without `[auth]`.
    #[serde(default)]
    pub insecure_no_auth: bool,
    /// Injected faults on received datagrams, a test aid (off unless the
    /// section is present).
    #[serde(default)]
    pub faults: Option<FaultsConfig>,
    /// This daemon's slot (0..=255), with `discovery` only: unique in the
    /// cluster (without `discovery` the slot is the index of `listen` among
    /// the sorted addresses).
    #[serde(default)]
    pub slot: Option<u32>,
    /// Optional TCP listener for clients, guarded by a token.
    #[serde(default)]
    pub tcp: Option<TcpConfig>,
    #[serde(default)]
    pub limits: Limits,
    /// The daemons' membership and their vsync group (every protocol
    /// setting, `[cluster]`, `[cluster.vsync]`, `[cluster.vsync.pbcast]`).
    #[serde(default = "default_cluster")]
    pub cluster: shoal_core::daemon::membership::Config,
    /// The cluster key that authenticates datagrams between daemons.
    #[serde(default)]
    pub auth: Option<AuthConfig>,
    /// The Prometheus endpoint (`GET /metrics`).
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
    /// `[qsm]`: `reliable` and `fifo` groups carried by QSM regions,
    /// outside the total order (off by default; `docs/qsm.md`).
    #[serde(default)]
    pub qsm: shoal_core::daemon::QsmSettings,
}

/// `[metrics]`: where to serve the Prometheus text endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// A TCP address (or host name and port), e.g. "127.0.0.1:9464". The
    /// endpoint has no authentication: beyond loopback, firewall it.
    pub address: SocketAddr,
}

/// `[ip_multicast]`: the scope of the `multicast` and `discovery` sockets.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IpMulticastConfig {
    /// Where multicast is sent and received. For an IPv4 group, one of this
    /// host's IPv4 addresses (default 127.0.0.1); for an IPv6 group, an
    /// interface name ("eth0", resolved at start-up) or index ("2"),
    /// required. Only with `multicast` or `discovery`.
    pub interface: Option<String>,
    /// `IP_MULTICAST_TTL` (`IPV6_MULTICAST_HOPS`), 0..=255. Default 0:
    /// nothing leaves the host, so beyond loopback it must be set (1 for
    /// one LAN segment, more only across multicast routers).
    pub ttl: u32,
}

/// `[faults]`: loss, duplication and delay injected on the datagrams this
/// daemon receives from its peers, before its engine sees them, and loss
/// and duplication of those it sends (`crate::Faults`). A test aid, for reproducing network trouble on a
/// real network; never for production. Off unless the section is present.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultsConfig {
    /// Probability in [0, 1) that a received datagram is dropped.
    pub loss: f64,
    /// Probability in [0, 1) that a received datagram is handed over twice.
    pub duplicate: f64,
    /// Added to every received datagram's arrival, in milliseconds.
    pub delay_ms: u64,
    /// A further uniform random delay in [0, jitter_ms] per datagram;
    /// datagrams then overtake each other (reordering).
    pub jitter_ms: u64,
    /// Probability in [0, 1) that a datagram this daemon sends is dropped
    /// (an IP multicast then for every receiver at once).
    pub send_loss: f64,
    /// Probability in [0, 1) that a datagram this daemon sends goes twice.
    pub send_duplicate: f64,
    /// Seed of the fault generator; default: drawn from the daemon's
    /// incarnation, so each daemon and each restart draws differently.
    pub seed: Option<u64>,
}

/// `[auth]`: the cluster key (64 hex digits, inline or in a file) and
/// whether payloads are also encrypted.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    #[serde(default)]
    pub encrypt: bool,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field("key_file", &self.key_file)
            .field("encrypt", &self.encrypt)
            .finish()
    }
}

impl AuthConfig {
    /// The key, read from `key` or `key_file`.
    pub fn cluster_key(&self) -> Result<crate::ClusterKey, ConfigError> {
        let invalid = |key, why: String| ConfigError::Invalid { key, why };
        let text = match (&self.key, &self.key_file) {
            (Some(k), None) => k.clone(),
            (None, Some(path)) => {
                std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?
            }
            _ => {
                return Err(invalid(
                    "auth",
                    "needs exactly one of `key` and `key_file`".to_string(),
                ))
            }
        };
        crate::ClusterKey::from_hex(&text).map_err(|e| invalid("auth.key", e.to_string()))
    }
}

/// `addr` as an admin-scoped group with a port; errors name `key`.
fn admin_group(
    key: &'static str,
    addr: Option<SocketAddr>,
) -> Result<Option<crate::MulticastGroup>, ConfigError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    crate::MulticastGroup::from_addr(addr)
        .map(Some)
        .map_err(|_| ConfigError::Invalid {
            key,
            why: format!(
                "{addr} is not an administratively scoped group with a port (IPv4 239.255.0.0/16; IPv6 ff02::/16, ff04::/16, ff05::/16 or ff08::/16)"
            ),
        })
}

/// The address of `text` in `key`: a literal as it is, else a host name
/// resolved by `resolver`, preferring `family` (IPv4 or IPv6) if given.
fn resolve_host(
    key: &'static str,
    text: &str,
    family: Option<bool>,
    resolver: &dyn Resolve,
) -> Result<SocketAddr, ConfigError> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let error = |why: String| ConfigError::Resolve {
        key,
        name: text.to_string(),
        why,
    };
    let addrs = resolver.host(text).map_err(|e| error(e.to_string()))?;
    let preferred = addrs
        .iter()
        .find(|a| family.is_some_and(|v4| a.is_ipv4() == v4));
    preferred
        .or(addrs.first())
        .copied()
        .ok_or_else(|| error("the name has no address".to_string()))
}

/// Replaces the host names of the address settings in `table` (and an
/// interface name in `ip_multicast.interface`) by what they resolve to,
/// so that deserialising reads literals only. Values of the wrong type are
/// left for the deserialiser to refuse, naming the key.
fn resolve_names(table: &mut toml::Table, resolver: &dyn Resolve) -> Result<(), ConfigError> {
    let mut family = None;
    if let Some(toml::Value::String(text)) = table.get_mut("listen") {
        let addr = resolve_host("listen", text, None, resolver)?;
        family = Some(addr.is_ipv4());
        *text = addr.to_string();
    }
    if let Some(toml::Value::Array(peers)) = table.get_mut("peers") {
        for peer in peers.iter_mut() {
            if let toml::Value::String(text) = peer {
                *text = resolve_host("peers", text, family.or(Some(true)), resolver)?.to_string();
            }
        }
    }
    for (section, key) in [("tcp", "tcp.address"), ("metrics", "metrics.address")] {
        let value = table
            .get_mut(section)
            .and_then(|s| s.as_table_mut())
            .and_then(|s| s.get_mut("address"));
        if let Some(toml::Value::String(text)) = value {
            *text = resolve_host(key, text, family, resolver)?.to_string();
        }
    }
    let interface = table
        .get_mut("ip_multicast")
        .and_then(|s| s.as_table_mut())
        .and_then(|s| s.get_mut("interface"));
    if let Some(toml::Value::String(text)) = interface {
        if text.parse::<IpAddr>().is_err() && text.parse::<u32>().is_err() {
            let index = resolver.interface(text).map_err(|e| ConfigError::Resolve {
                key: "ip_multicast.interface",
                name: text.clone(),
                why: e.to_string(),
            })?;
            *text = index.to_string();
        }
    }
    Ok(())
}

/// Writes `user`'s keys over `base`, recursing into tables.
fn overlay(base: &mut toml::Value, user: toml::Value) {
    match (base, user) {
        (toml::Value::Table(base), toml::Value::Table(user)) => {
            for (key, value) in user {
                match base.get_mut(&key) {
                    Some(slot) => overlay(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (slot, value) => *slot = value,
    }
}

/// The daemons' defaults where they differ from the papers' experiments:
/// a committee of 3, so that one failed daemon, the primary included, does
/// not stop the cluster (P000 §6 measures k = 1); datagrams up to 65,507
/// bytes less the authentication envelope, the loopback path's size (a
/// configuration beyond loopback lowers it: `max_datagram`; DESIGN.md
/// "Pack and batch"); progress reports every
/// 100 ms, so that the committee collects delivered records at once rather
/// than holding every record of a view period (gigabytes at full rate);
/// committee members delivering from their stores (`committee_delivery`),
/// which takes two hops off an ordered message's way to them, and, in a
/// cluster no larger than its committee, the pbcast of every payload;
/// a primary asking silent members it heard from during a view change
/// once more before dropping them (`ask_heard_again`).
/// Where the engines' datagrams go in fragments (beyond loopback), parsing
/// also turns on `repair_done_apart`: a repair answer's end in a datagram
/// of its own, so that a lost fragment of the answer's last datagram does
/// not also lose the member's cue to ask for the rest.
pub fn default_cluster() -> shoal_core::daemon::membership::Config {
    // The shared daemon defaults, with this runtime's datagram size for
    // loopback (parsing a file sets it from `max_datagram`).
    let mut c = shoal_core::daemon::membership::Config::daemon_defaults();
    c.vsync.pbcast.max_datagram_size = LOOPBACK_DATAGRAM - crate::OVERHEAD;
    c
}

/// A TCP client listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpConfig {
    /// Any address (or host name and port) of this host, e.g.
    /// "10.0.0.1:4803". The token travels in clear: beyond loopback, on a
    /// trusted network only.
    pub address: SocketAddr,
    /// What a TCP client must present when it connects; not empty.
    pub token: String,
}

/// Resource limits of one daemon: `[limits]` (the engine enforces them).
pub use shoal_core::daemon::Limits;

fn default_node() -> String {
    "shoal".to_string()
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 4804))
}

/// `$XDG_RUNTIME_DIR/shoal.sock` when that is set, else `/tmp/shoal-<uid>.sock`
/// (the uid of this process; see `shoal_wire::client::default_socket_path`).
pub fn default_socket() -> PathBuf {
    shoal_wire::client::default_socket_path()
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            node: default_node(),
            socket: default_socket(),
            listen: default_listen(),
            peers: Vec::new(),
            multicast: None,
            discovery: None,
            ip_multicast: IpMulticastConfig::default(),
            max_datagram: None,
            engine_datagram: None,
            insecure_no_auth: false,
            faults: None,
            slot: None,
            tcp: None,
            limits: Limits::default(),
            cluster: default_cluster(),
            auth: None,
            metrics: None,
            qsm: shoal_core::daemon::QsmSettings::default(),
        }
    }
}

impl DaemonConfig {
    /// Parses and validates a configuration text, resolving host names with
    /// the system's resolver.
    pub fn parse(text: &str) -> Result<DaemonConfig, ConfigError> {
        DaemonConfig::parse_with(text, &SystemResolver)
    }

    /// Parses and validates a configuration text, resolving names with
    /// `resolver`.
    pub fn parse_with(text: &str, resolver: &dyn Resolve) -> Result<DaemonConfig, ConfigError> {
        let mut table: toml::Table = toml::from_str(text)?;
        resolve_names(&mut table, resolver)?;
        let user_cluster = table.remove("cluster");
        let mut config: DaemonConfig = toml::Value::Table(table).try_into()?;
        let explicit_size = user_cluster
            .as_ref()
            .and_then(|c| c.get("vsync"))
            .and_then(|v| v.get("pbcast"))
            .and_then(|p| p.get("max_datagram_size"))
            .is_some();
        if let Some(user) = user_cluster {
            // A `[cluster...]` section must override the daemon's cluster
            // defaults key by key, not reset the section to the engine's
            // defaults (serde fills a present table from `Default`).
            let mut merged =
                toml::Value::try_from(default_cluster()).map_err(|e| ConfigError::Invalid {
                    key: "cluster",
                    why: e.to_string(),
                })?;
            overlay(&mut merged, user);
            config.cluster = merged.try_into()?;
        }
        config.validate()?;
        config.fit_datagram_size(explicit_size)?;
        Ok(config)
    }

    /// Whether this daemon talks beyond loopback: `listen`, a peer, or the
    /// multicast interface is not a loopback address.
    pub fn beyond_loopback(&self) -> bool {
        let interface_beyond = match self.multicast_options() {
            Ok(o) => match o.interface {
                MulticastInterface::V4(ip) => !ip.is_loopback(),
                MulticastInterface::V6(_) => true,
            },
            Err(_) => true,
        };
        !self.listen.ip().is_loopback()
            || self.peers.iter().any(|p| !p.ip().is_loopback())
            || (self.joined_group().ok().flatten().is_some() && interface_beyond)
    }

    /// The largest UDP payload sent: `max_datagram`, or its default for the
    /// path (see the field).
    pub fn datagram_size(&self) -> usize {
        match (self.max_datagram, self.beyond_loopback()) {
            (Some(size), _) => size,
            (None, false) => LOOPBACK_DATAGRAM,
            (None, true) if self.listen.is_ipv6() => ETHERNET_DATAGRAM_V6,
            (None, true) => ETHERNET_DATAGRAM_V4,
        }
    }

    /// The largest datagram the engines build: `engine_datagram`, or its
    /// default for the path (see the field).
    pub fn engine_datagram_size(&self) -> usize {
        let path = self.datagram_size();
        match (self.engine_datagram, self.beyond_loopback()) {
            (Some(size), _) => size,
            (None, true) => path.max(LAN_ENGINE_DATAGRAM),
            (None, false) => path,
        }
    }

    /// Room for the engines' datagrams: one that fits the path is sealed
    /// whole and leaves room for the authentication envelope; a larger one
    /// goes in fragments, each sealed on its own.
    fn engine_room(&self) -> usize {
        let engine = self.engine_datagram_size();
        if engine > self.datagram_size() {
            engine
        } else {
            engine - crate::OVERHEAD
        }
    }

    /// Sets the engines' datagram size from
    /// [`DaemonConfig::engine_datagram_size`], or checks that an explicit
    /// `cluster.vsync.pbcast.max_datagram_size` fits in it.
    fn fit_datagram_size(&mut self, explicit: bool) -> Result<(), ConfigError> {
        let size = self.engine_datagram_size();
        let room = self.engine_room();
        if size > self.datagram_size() {
            // Datagrams in fragments: one lost fragment loses a whole
            // repair answer, and its end must not go with it.
            self.cluster.vsync.repair_done_apart = true;
        }
        let engine = &mut self.cluster.vsync.pbcast.max_datagram_size;
        if !explicit {
            *engine = room;
        } else if *engine > room {
            return Err(ConfigError::Invalid {
                key: "cluster.vsync.pbcast.max_datagram_size",
                why: format!(
                    "is {engine}, more than the engines' datagram ({size}, `engine_datagram`, less the {}-byte authentication envelope when it fits `max_datagram`); leave it unset to follow them",
                    crate::OVERHEAD
                ),
            });
        }
        Ok(())
    }

    /// The socket options of the daemon's endpoint: the multicast scope of
    /// `[ip_multicast]`, default buffers.
    pub fn socket_options(&self) -> Result<SocketOptions, ConfigError> {
        Ok(SocketOptions {
            multicast: self.multicast_options()?,
            ..SocketOptions::default()
        })
    }

    /// The daemon's endpoint: its unicast socket on `listen` and, with
    /// `multicast` or `discovery`, the group joined on the interface of
    /// `[ip_multicast]`. An error names the setting.
    pub fn bind(&self) -> Result<crate::Endpoint, ConfigError> {
        let options = self.socket_options()?;
        let mut endpoint =
            crate::Endpoint::bind(self.listen, &options).map_err(|source| ConfigError::Socket {
                key: "listen",
                value: self.listen.to_string(),
                source,
            })?;
        if let Some(group) = self.joined_group()? {
            let key = if self.multicast.is_some() {
                "multicast"
            } else {
                "discovery"
            };
            let interface = self
                .ip_multicast
                .interface
                .as_deref()
                .unwrap_or("127.0.0.1");
            endpoint
                .join(group, &options)
                .map_err(|source| ConfigError::Socket {
                    key,
                    value: format!("{} on interface {interface}", group.addr()),
                    source,
                })?;
        }
        Ok(endpoint)
    }

    /// `[ip_multicast]` as socket options: the interface parsed for the
    /// joined group's family, the TTL.
    pub fn multicast_options(&self) -> Result<MulticastOptions, ConfigError> {
        let invalid = |why: String| ConfigError::Invalid {
            key: "ip_multicast.interface",
            why,
        };
        let ttl = self.ip_multicast.ttl;
        let v6_group = self.scoped_multicast()?.is_some_and(|g| g.is_ipv6());
        let interface = match (&self.ip_multicast.interface, v6_group) {
            (None, false) => MulticastInterface::V4(Ipv4Addr::LOCALHOST),
            (None, true) => {
                return Err(invalid(
                    "is required with an IPv6 group: the name (\"eth0\") or index of the interface".into(),
                ))
            }
            (Some(text), false) => MulticastInterface::V4(text.parse().map_err(|_| {
                invalid(format!(
                    "{text:?} is not an IPv4 address: with an IPv4 group, name this host's address on the LAN"
                ))
            })?),
            (Some(text), true) => MulticastInterface::V6(text.parse().map_err(|_| {
                invalid(format!(
                    "{text:?} is not an interface index or name: with an IPv6 group, name the interface (\"eth0\") or its index"
                ))
            })?),
        };
        Ok(MulticastOptions { interface, ttl })
    }

    /// The fault layer of `[faults]` (inactive without the section), seeded
    /// with `seed` unless the section gives one.
    pub fn fault_config(&self, seed: u64) -> FaultConfig {
        let Some(f) = &self.faults else {
            return FaultConfig::default();
        };
        FaultConfig {
            drop_probability: f.loss,
            duplicate_probability: f.duplicate,
            delay: Duration::from_millis(f.delay_ms),
            jitter: Duration::from_millis(f.jitter_ms),
            send_drop_probability: f.send_loss,
            send_duplicate_probability: f.send_duplicate,
            seed: f.seed.unwrap_or(seed),
        }
    }

    /// The IP multicast group of `multicast`, checked (admin-scoped IPv4,
    /// a port).
    pub fn multicast_group(&self) -> Result<Option<crate::MulticastGroup>, ConfigError> {
        admin_group("multicast", self.multicast)
    }

    /// The IP multicast group of `discovery`, checked like `multicast`.
    pub fn discovery_group(&self) -> Result<Option<crate::MulticastGroup>, ConfigError> {
        admin_group("discovery", self.discovery)
    }

    /// The one group the endpoint joins: `multicast`'s or `discovery`'s
    /// (the same address when both are set, as `validate` checks).
    pub fn joined_group(&self) -> Result<Option<crate::MulticastGroup>, ConfigError> {
        Ok(self.multicast_group()?.or(self.discovery_group()?))
    }

    /// The discovery settings: `slot` is required with `discovery`, only
    /// then allowed, and `peers` must be empty (a listed peer's slot is not
    /// known, so it could not be routed to).
    fn validate_discovery(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: &str| ConfigError::Invalid {
            key,
            why: why.to_string(),
        };
        self.discovery_group()?;
        match (self.discovery, self.slot) {
            (None, Some(_)) => Err(invalid(
                "slot",
                "is only for `discovery`: with `peers` the slot is the index of `listen` among the sorted addresses",
            )),
            (Some(_), None) => Err(invalid(
                "slot",
                "is required with `discovery`: a number 0..=255, unique in the cluster",
            )),
            (Some(_), Some(slot)) if slot as usize >= shoal_core::daemon::membership::MAX_SLOTS => Err(
                invalid("slot", &format!("{slot} is not in 0..={}", shoal_core::daemon::membership::MAX_SLOTS - 1)),
            ),
            (Some(_), Some(_)) if !self.peers.is_empty() => Err(invalid(
                "peers",
                "must be empty with `discovery`: daemons find each other on the group",
            )),
            (Some(d), Some(_)) if self.multicast.is_some_and(|m| m != d) => Err(invalid(
                "discovery",
                "must be the same address as `multicast` when both are set (a daemon joins one group)",
            )),
            _ => Ok(()),
        }
    }

    /// Reads, parses and validates a configuration file; an error names
    /// the file.
    pub fn load(path: &std::path::Path) -> Result<DaemonConfig, ConfigError> {
        DaemonConfig::load_with(path, &SystemResolver)
    }

    /// As [`DaemonConfig::load`], resolving names with `resolver`.
    pub fn load_with(
        path: &std::path::Path,
        resolver: &dyn Resolve,
    ) -> Result<DaemonConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        DaemonConfig::parse_with(&text, resolver).map_err(|error| ConfigError::File {
            path: path.to_path_buf(),
            error: Box::new(error),
        })
    }

    /// `listen` and `peers`: specific unicast addresses of one family.
    fn validate_addresses(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: String| ConfigError::Invalid { key, why };
        let listen = self.listen;
        if listen.port() == 0 {
            return Err(invalid(
                "listen",
                "needs a fixed port: peers find this daemon at it".into(),
            ));
        }
        if listen.ip().is_unspecified() || listen.ip().is_multicast() {
            return Err(invalid(
                "listen",
                format!("{listen} is not a specific unicast address of this host: peers know a daemon by the address its datagrams come from"),
            ));
        }
        for p in &self.peers {
            if p.port() == 0 || p.ip().is_unspecified() || p.ip().is_multicast() {
                return Err(invalid(
                    "peers",
                    format!("{p} is not a daemon's unicast address with a port"),
                ));
            }
            if listen.ip().is_loopback() && !p.ip().is_loopback() {
                return Err(invalid(
                    "peers",
                    format!("{p} is beyond loopback but `listen` ({listen}) is a loopback address, from which it cannot be reached: listen on this host's address on that network"),
                ));
            }
            if p.is_ipv4() != listen.is_ipv4() {
                return Err(invalid(
                    "peers",
                    format!("{p} is not of `listen`'s address family ({listen}): a daemon's one socket reaches one family"),
                ));
            }
        }
        if self.peers.contains(&listen) {
            return Err(invalid(
                "peers",
                "must not contain this daemon's `listen`".into(),
            ));
        }
        Ok(())
    }

    /// `[ip_multicast]`: only with a group, of the group's family, and a
    /// TTL that lets the datagrams reach the peers.
    /// The address whose family `[ip_multicast]` scopes: the group of
    /// `multicast` or `discovery`, else the first region address of
    /// `[qsm] multicast`.
    fn scoped_multicast(&self) -> Result<Option<SocketAddr>, ConfigError> {
        Ok(self
            .joined_group()?
            .map(|g| g.addr())
            .or(self.qsm.multicast))
    }

    /// `[qsm] multicast`: every region address administratively scoped
    /// (the range stays inside 239.255.0.0/16 for IPv4), of `listen`'s
    /// family, and not the group of `multicast` or `discovery`.
    fn validate_qsm_multicast(&self) -> Result<(), ConfigError> {
        let Some(base) = self.qsm.multicast else {
            return Ok(());
        };
        let invalid = |why: String| ConfigError::Invalid {
            key: "qsm.multicast",
            why,
        };
        let count = self.qsm.multicast_addresses.get();
        let last = self.qsm.region_group(count - 1).expect("set");
        for addr in [base, last] {
            crate::MulticastGroup::from_addr(addr).map_err(|_| {
                invalid(format!("{base} with {count} addresses reaches {addr}, outside the administratively scoped range (239.255.0.0/16, or IPv6 ff02/ff04/ff05/ff08), or port 0"))
            })?;
        }
        if last < base {
            return Err(invalid(format!(
                "{base} with {count} addresses wraps around"
            )));
        }
        if base.is_ipv4() != self.listen.is_ipv4() {
            return Err(invalid(format!(
                "{base} is not of `listen`'s address family ({}): region multicast is sent from the `listen` socket",
                self.listen
            )));
        }
        if let Some(g) = self.joined_group()? {
            let g = g.addr();
            if g.port() == base.port() && g.ip() >= base.ip() && g.ip() <= last.ip() {
                return Err(invalid(format!(
                    "its addresses {base}..{last} include the group of `multicast`/`discovery` ({g})"
                )));
            }
        }
        Ok(())
    }

    fn validate_multicast_scope(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: String| ConfigError::Invalid { key, why };
        let Some(group) = self.scoped_multicast()? else {
            if self.ip_multicast != IpMulticastConfig::default() {
                return Err(invalid(
                    "ip_multicast",
                    "is only for `multicast`, `discovery` or `qsm.multicast`, and none is set"
                        .into(),
                ));
            }
            return Ok(());
        };
        if group.is_ipv4() != self.listen.is_ipv4() {
            return Err(invalid(
                "multicast",
                format!("{group} is not of `listen`'s address family ({}): multicast is sent from the `listen` socket", self.listen),
            ));
        }
        let ttl = self.ip_multicast.ttl;
        if ttl > 255 {
            return Err(invalid(
                "ip_multicast.ttl",
                format!("{ttl} is not in 0..=255"),
            ));
        }
        let options = self.multicast_options()?;
        let local_interface =
            matches!(options.interface, MulticastInterface::V4(ip) if ip.is_loopback());
        if !local_interface && ttl == 0 {
            return Err(invalid(
                "ip_multicast.ttl",
                "is 0, so multicast never leaves this host: set 1 to reach the daemons on the LAN"
                    .into(),
            ));
        }
        if local_interface && !self.listen.ip().is_loopback() {
            return Err(invalid(
                "ip_multicast.interface",
                format!("is loopback (the default) but `listen` ({}) is not: multicast would stay on this host; name this host's address on the LAN (and set `ip_multicast.ttl = 1`)", self.listen),
            ));
        }
        Ok(())
    }

    /// Beyond loopback, `[auth]` unless `insecure_no_auth` says otherwise.
    fn validate_auth(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: String| ConfigError::Invalid { key, why };
        if self.auth.is_some() && self.insecure_no_auth {
            return Err(invalid(
                "insecure_no_auth",
                "contradicts the `[auth]` section: remove one".into(),
            ));
        }
        let exposed = !self.listen.ip().is_loopback()
            || self.joined_group()?.is_some()
                && !matches!(self.multicast_options()?.interface, MulticastInterface::V4(ip) if ip.is_loopback());
        if exposed && self.auth.is_none() && !self.insecure_no_auth {
            return Err(invalid(
                "auth",
                format!(
                    "is required: this daemon listens beyond loopback ({}), and without a cluster key anyone who can reach it can forge datagrams (one forged datagram can evict a daemon or inject messages). Add `[auth]` with `key_file` (see docs/daemon.md), or set `insecure_no_auth = true` to accept the risk",
                    self.listen
                ),
            ));
        }
        Ok(())
    }

    /// `max_datagram` within what UDP and the engines allow; `[faults]`
    /// probabilities in [0, 1).
    fn validate_datagram_and_faults(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: String| ConfigError::Invalid { key, why };
        let min = shoal_core::pbcast::MIN_DATAGRAM_SIZE + crate::OVERHEAD;
        for (key, size) in [
            ("max_datagram", self.max_datagram),
            ("engine_datagram", self.engine_datagram),
        ] {
            let Some(size) = size else { continue };
            if !(min..=LOOPBACK_DATAGRAM).contains(&size) {
                return Err(invalid(
                    key,
                    format!("{size} is not in {min}..={LOOPBACK_DATAGRAM} bytes"),
                ));
            }
        }
        if let Some(f) = &self.faults {
            for (key, p) in [
                ("faults.loss", f.loss),
                ("faults.duplicate", f.duplicate),
                ("faults.send_loss", f.send_loss),
                ("faults.send_duplicate", f.send_duplicate),
            ] {
                if !(0.0..1.0).contains(&p) {
                    return Err(invalid(key, format!("{p} is not a probability in [0, 1)")));
                }
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: &str| ConfigError::Invalid {
            key,
            why: why.to_string(),
        };
        if let Err(e) = self.qsm.engine.validate() {
            return Err(invalid("qsm.engine", &e.to_string()));
        }
        if self.node.is_empty() {
            return Err(invalid("node", "must not be empty"));
        }
        self.validate_addresses()?;
        self.multicast_group()?;
        self.validate_discovery()?;
        self.validate_qsm_multicast()?;
        self.validate_multicast_scope()?;
        self.validate_auth()?;
        self.validate_datagram_and_faults()?;
        if let Some(tcp) = &self.tcp {
            if tcp.token.is_empty() {
                return Err(invalid("tcp.token", "must not be empty"));
            }
        }
        let l = &self.limits;
        for (key, v) in [
            ("limits.clients", l.clients),
            ("limits.groups_per_client", l.groups_per_client),
            ("limits.group_name_len", l.group_name_len),
            ("limits.message_size", l.message_size),
            ("limits.client_queue", l.client_queue),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if l.group_name_len > usize::from(u16::MAX) {
            return Err(invalid("limits.group_name_len", "must be at most 65535"));
        }
        if l.message_size > u32::MAX as usize {
            return Err(invalid("limits.message_size", "must fit in 32 bits"));
        }
        if self.peers.len() + 1 > shoal_core::daemon::membership::MAX_SLOTS {
            return Err(invalid(
                "peers",
                &format!(
                    "at most {} daemons",
                    shoal_core::daemon::membership::MAX_SLOTS
                ),
            ));
        }
        if let Some(auth) = &self.auth {
            auth.cluster_key()?;
        }
        if let Err(e) = self.cluster.vsync.validate() {
            return Err(invalid("cluster.vsync", &e.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_section_overrides_the_daemon_defaults_key_by_key() {
        let c = DaemonConfig::parse("[cluster.vsync]\nview_period = 2000\n").unwrap();
        assert_eq!(c.cluster.vsync.view_period.as_millis(), 2000);
        // Daemon defaults kept, not reset to the engine's.
        assert_eq!(c.cluster.vsync.committee_size.get(), 3);
        assert_eq!(
            c.cluster.vsync.pbcast.max_datagram_size,
            65_507 - crate::OVERHEAD
        );
        assert_eq!(c.cluster.vsync.progress_interval.as_millis(), 100);
        assert!(c.cluster.vsync.committee_delivery);
        assert!(c.cluster.vsync.ask_heard_again);
        assert!(!c.cluster.vsync.repair_done_apart, "loopback: no fragments");
        let c = DaemonConfig::parse("[cluster]\nfound_after = 700\n").unwrap();
        assert_eq!(c.cluster.found_after.as_millis(), 700);
        assert_eq!(c.cluster.vsync.committee_size.get(), 3);
        let e = DaemonConfig::parse("[cluster.vsync]\nview_perod = 2000\n").unwrap_err();
        assert!(e.to_string().contains("view_perod"), "{e}");
    }

    #[test]
    fn auth_key_is_checked_at_start_up() {
        let ok = format!("[auth]\nkey = \"{}\"\n", "ab".repeat(32));
        assert!(DaemonConfig::parse(&ok).unwrap().auth.is_some());
        let err = DaemonConfig::parse("[auth]\nkey = \"xyz\"\n").unwrap_err();
        assert!(err.to_string().contains("auth.key"), "{err}");
        let err = DaemonConfig::parse("[auth]\nencrypt = true\n").unwrap_err();
        assert!(err.to_string().contains("`auth`"), "{err}");
        let err = DaemonConfig::parse("[auth]\nkeyy = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("keyy"), "{err}");
    }

    #[test]
    fn empty_file_gives_the_defaults() {
        let c = DaemonConfig::parse("").unwrap();
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.limits.message_size, 1 << 20);
        assert!(c.peers.is_empty());
        assert!(c.tcp.is_none());
    }

    #[test]
    fn the_qsm_section_is_off_by_default_and_parses() {
        let c = DaemonConfig::parse("").unwrap();
        assert!(!c.qsm.enabled);
        let c = DaemonConfig::parse(
            "[qsm]\nenabled = true\nservices = [\"fifo\"]\nflush_timeout = 5000\n[qsm.engine]\ntoken_interval = 500\n",
        )
        .unwrap();
        assert!(c.qsm.enabled);
        assert_eq!(
            c.qsm.services,
            vec![shoal_core::daemon::regions::RegionService::Fifo]
        );
        assert_eq!(c.qsm.flush_timeout, std::time::Duration::from_secs(5));
        assert_eq!(
            c.qsm.engine.token_interval,
            std::time::Duration::from_millis(500)
        );
        let bad = DaemonConfig::parse("[qsm.engine]\ntoken_interval = 0\n").unwrap_err();
        assert!(bad.to_string().contains("qsm.engine"), "{bad}");
        assert!(DaemonConfig::parse("[qsm]\nservices = [\"agreed\"]\n").is_err());
        assert!(c.qsm.hybrid.is_empty());
        let c =
            DaemonConfig::parse("[qsm]\nenabled = true\nhybrid = [\"hot\", \"news\"]\n").unwrap();
        assert_eq!(c.qsm.hybrid, vec!["hot".to_string(), "news".to_string()]);
    }

    #[test]
    fn qsm_region_multicast_addresses_are_scoped_and_checked() {
        let c = DaemonConfig::parse(
            "[qsm]\nenabled = true\nmulticast = \"239.255.42.0:9300\"\nmulticast_addresses = 64\n",
        )
        .unwrap();
        assert_eq!(c.qsm.multicast, Some("239.255.42.0:9300".parse().unwrap()));
        assert_eq!(
            c.qsm.region_group(65),
            Some("239.255.42.1:9300".parse().unwrap())
        );
        // Loopback, TTL 0 by default; [ip_multicast] may now scope it.
        assert!(c.socket_options().is_ok());
        for (text, why) in [
            ("multicast = \"239.1.0.0:9300\"", "outside"),
            (
                "multicast = \"239.255.255.200:9300\"\nmulticast_addresses = 100",
                "outside",
            ),
            ("multicast = \"239.255.0.0:0\"", "port 0"),
        ] {
            let bad = DaemonConfig::parse(&format!("[qsm]\n{text}\n")).unwrap_err();
            assert!(bad.to_string().contains("qsm.multicast"), "{text}: {bad}");
            assert!(bad.to_string().contains(why), "{text}: {bad}");
        }
        let clash = DaemonConfig::parse(
            "multicast = \"239.255.42.5:9300\"\n[qsm]\nmulticast = \"239.255.42.0:9300\"\n",
        )
        .unwrap_err();
        assert!(clash.to_string().contains("include the group"), "{clash}");
    }

    #[test]
    fn full_file_parses() {
        let c = DaemonConfig::parse(
            r#"
            node = "a"
            socket = "/tmp/a.sock"
            listen = "127.0.0.1:9000"
            peers = ["127.0.0.1:9001", "127.0.0.1:9002"]
            [tcp]
            address = "127.0.0.1:4803"
            token = "t"
            [limits]
            client_queue = 8
            "#,
        )
        .unwrap();
        assert_eq!(c.node, "a");
        assert_eq!(c.socket, PathBuf::from("/tmp/a.sock"));
        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.tcp.unwrap().token, "t");
        assert_eq!(c.limits.client_queue, 8);
        assert_eq!(c.limits.clients, Limits::default().clients);
    }

    #[test]
    fn unknown_keys_are_refused_by_name() {
        let e = DaemonConfig::parse("nodes = \"a\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nodes"), "{e}");
        let e = DaemonConfig::parse("[limits]\nclient_queues = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("client_queues"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        for (text, key) in [
            ("node = \"\"", "`node`"),
            ("listen = \"127.0.0.1:0\"", "`listen`"),
            ("listen = \"0.0.0.0:4804\"", "`listen`"),
            ("listen = \"[::]:4804\"", "`listen`"),
            ("listen = \"239.255.1.1:4804\"", "`listen`"),
            ("peers = [\"127.0.0.2:0\"]", "`peers`"),
            ("peers = [\"0.0.0.0:4804\"]", "`peers`"),
            ("peers = [\"[::1]:4804\"]", "`peers`"),
            ("peers = [\"10.0.0.2:4804\"]", "`peers`"),
            (
                "listen = \"127.0.0.1:5\"\npeers = [\"127.0.0.1:5\"]",
                "`peers`",
            ),
            (
                "[tcp]\naddress = \"127.0.0.1:1\"\ntoken = \"\"",
                "`tcp.token`",
            ),
            ("[limits]\nclient_queue = 0", "`limits.client_queue`"),
            (
                "[limits]\ngroup_name_len = 70000",
                "`limits.group_name_len`",
            ),
        ] {
            let e = DaemonConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_wrongly_typed_value_is_refused_naming_the_key() {
        let e = DaemonConfig::parse("[limits]\nclients = \"many\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("clients"), "{e}");
    }

    #[test]
    fn the_multicast_group_must_be_admin_scoped_ipv4_with_a_port() {
        for bad in [
            "224.0.0.1:9000",
            "239.255.1.1:0",
            "127.0.0.1:9000",
            "[ff05::1]:9000",
        ] {
            let e = DaemonConfig::parse(&format!("multicast = \"{bad}\""))
                .unwrap_err()
                .to_string();
            assert!(e.contains("`multicast`"), "{bad}: {e}");
        }
        let good = DaemonConfig::parse("multicast = \"239.255.7.7:9100\"").unwrap();
        assert!(good.multicast_group().unwrap().is_some());
        assert!(DaemonConfig::default().multicast_group().unwrap().is_none());
    }

    #[test]
    fn discovery_needs_a_slot_and_no_peers() {
        let c = DaemonConfig::parse("discovery = \"239.255.7.7:9100\"\nslot = 255").unwrap();
        assert_eq!(c.slot, Some(255));
        assert!(c.discovery_group().unwrap().is_some());
        assert_eq!(c.joined_group().unwrap(), c.discovery_group().unwrap());
        assert!(c.multicast_group().unwrap().is_none());
        for (text, key) in [
            ("discovery = \"239.255.7.7:9100\"", "`slot`"),
            ("slot = 1", "`slot`"),
            ("discovery = \"239.255.7.7:9100\"\nslot = 256", "`slot`"),
            ("discovery = \"224.0.0.1:9100\"\nslot = 1", "`discovery`"),
            ("discovery = \"239.255.7.7:0\"\nslot = 1", "`discovery`"),
            (
                "discovery = \"239.255.7.7:9100\"\nslot = 1\npeers = [\"127.0.0.1:9001\"]",
                "`peers`",
            ),
            (
                "discovery = \"239.255.7.7:9100\"\nslot = 1\nmulticast = \"239.255.7.8:9100\"",
                "`discovery`",
            ),
        ] {
            let e = DaemonConfig::parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?}: {e}");
        }
        let e = DaemonConfig::parse("slot = -1").unwrap_err().to_string();
        assert!(e.contains("slot"), "{e}");
        let both = DaemonConfig::parse(
            "discovery = \"239.255.7.7:9100\"\nslot = 1\nmulticast = \"239.255.7.7:9100\"",
        )
        .unwrap();
        assert!(both.multicast_group().unwrap().is_some());
        assert_eq!(
            both.joined_group().unwrap(),
            both.discovery_group().unwrap()
        );
    }

    const KEY: &str =
        "[auth]\nkey = \"abababababababababababababababababababababababababababababababab\"\n";

    /// Names from a table; interfaces "eth0" = 2, "br0" = 7.
    struct Fake(&'static [(&'static str, &'static [&'static str])]);

    impl Resolve for Fake {
        fn host(&self, host_port: &str) -> io::Result<Vec<SocketAddr>> {
            let (_, addrs) = self
                .0
                .iter()
                .find(|(n, _)| *n == host_port)
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "unknown host"))?;
            Ok(addrs.iter().map(|a| a.parse().unwrap()).collect())
        }

        fn interface(&self, name: &str) -> io::Result<u32> {
            match name {
                "eth0" => Ok(2),
                "br0" => Ok(7),
                _ => Err(io::Error::new(io::ErrorKind::NotFound, "no interface")),
            }
        }
    }

    const HOSTS: Fake = Fake(&[
        ("host-a:4804", &["10.0.0.1:4804"]),
        ("host-a:4803", &["10.0.0.1:4803"]),
        ("host-b:4804", &["[fd00::2]:4804", "10.0.0.2:4804"]),
        ("host-c:4804", &["[fd00::3]:4804"]),
        ("nowhere:4804", &[]),
    ]);

    fn error(text: &str) -> String {
        DaemonConfig::parse_with(text, &HOSTS)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn any_ipv4_or_ipv6_address_is_accepted_for_every_address_setting() {
        let c = DaemonConfig::parse(&format!(
            "listen = \"10.0.0.1:4804\"\npeers = [\"10.0.0.2:4804\", \"192.168.7.3:4804\"]\n\
             [tcp]\naddress = \"10.0.0.1:4803\"\ntoken = \"t\"\n\
             [metrics]\naddress = \"0.0.0.0:9464\"\n{KEY}"
        ))
        .unwrap();
        assert_eq!(c.listen, "10.0.0.1:4804".parse().unwrap());
        assert_eq!(c.peers.len(), 2);
        assert!(c.beyond_loopback());
        let c = DaemonConfig::parse(&format!(
            "listen = \"[fd00::1]:4804\"\npeers = [\"[fd00::2]:4804\"]\n\
             [tcp]\naddress = \"[::]:4803\"\ntoken = \"t\"\n{KEY}"
        ))
        .unwrap();
        assert!(c.listen.is_ipv6());
        let c = DaemonConfig::parse("listen = \"[::1]:4804\"\npeers = [\"[::1]:4805\"]").unwrap();
        assert!(!c.beyond_loopback(), "IPv6 loopback needs no key");
    }

    #[test]
    fn beyond_loopback_without_auth_is_refused_unless_explicitly_insecure() {
        let lan = "listen = \"10.0.0.1:4804\"\npeers = [\"10.0.0.2:4804\"]\n";
        let e = error(lan);
        assert!(e.contains("`auth`") && e.contains("forged datagram"), "{e}");
        assert!(e.contains("insecure_no_auth"), "{e}");
        let ok = DaemonConfig::parse(&format!("{lan}insecure_no_auth = true\n")).unwrap();
        assert!(ok.auth.is_none() && ok.insecure_no_auth);
        assert!(DaemonConfig::parse(&format!("{lan}{KEY}")).is_ok());
        let e = error(&format!("insecure_no_auth = true\n{lan}{KEY}"));
        assert!(e.contains("`insecure_no_auth`"), "{e}");
        // Loopback peers, but multicast leaving by a LAN interface.
        let e = error(
            "multicast = \"239.255.7.7:9100\"\n[ip_multicast]\ninterface = \"10.0.0.1\"\nttl = 1\n",
        );
        assert!(e.contains("`auth`"), "{e}");
        // Loopback: as before, no key needed.
        assert!(DaemonConfig::parse("peers = [\"127.0.0.1:4805\"]").is_ok());
    }

    #[test]
    fn host_names_are_resolved_and_an_unknown_one_is_named() {
        let c = DaemonConfig::parse_with(
            &format!(
                "listen = \"host-a:4804\"\npeers = [\"host-b:4804\"]\n\
                 [tcp]\naddress = \"host-a:4803\"\ntoken = \"t\"\n{KEY}"
            ),
            &HOSTS,
        )
        .unwrap();
        assert_eq!(c.listen, "10.0.0.1:4804".parse().unwrap());
        // host-b has both families: `listen`'s is taken.
        assert_eq!(c.peers, vec!["10.0.0.2:4804".parse().unwrap()]);
        assert_eq!(
            c.tcp.unwrap().address,
            "10.0.0.1:4803".parse::<SocketAddr>().unwrap()
        );
        for (text, key, name) in [
            ("listen = \"ghost:4804\"", "`listen`", "ghost:4804"),
            ("peers = [\"nowhere:4804\"]", "`peers`", "nowhere:4804"),
            (
                "[metrics]\naddress = \"ghost:9464\"",
                "`metrics.address`",
                "ghost:9464",
            ),
            (
                "[tcp]\naddress = \"ghost:1\"\ntoken = \"t\"",
                "`tcp.address`",
                "ghost:1",
            ),
        ] {
            let e = error(text);
            assert!(e.contains(key) && e.contains(name), "{text}: {e}");
        }
        // Only IPv6 for a peer of an IPv4 daemon: refused as another family.
        let e = error(&format!(
            "listen = \"host-a:4804\"\npeers = [\"host-c:4804\"]\n{KEY}"
        ));
        assert!(e.contains("`peers`") && e.contains("family"), "{e}");
        // The system resolver knows localhost.
        let c = DaemonConfig::parse("listen = \"localhost:4804\"").unwrap();
        assert!(c.listen.ip().is_loopback());
    }

    #[test]
    fn the_datagram_size_follows_the_path_and_feeds_the_engines() {
        let engine = |c: &DaemonConfig| c.cluster.vsync.pbcast.max_datagram_size;
        let c = DaemonConfig::parse("").unwrap();
        assert_eq!(c.datagram_size(), 65_507);
        assert_eq!(engine(&c), 65_507 - crate::OVERHEAD);
        assert_eq!(engine(&DaemonConfig::default()), engine(&c));
        let lan = format!("listen = \"10.0.0.1:4804\"\n{KEY}");
        let c = DaemonConfig::parse(&lan).unwrap();
        assert_eq!(c.datagram_size(), 1_472);
        // Beyond loopback the engines build larger datagrams, sent in
        // fragments of the path's size.
        assert_eq!(c.engine_datagram_size(), LAN_ENGINE_DATAGRAM);
        assert_eq!(engine(&c), LAN_ENGINE_DATAGRAM);
        // ... and a repair answer's end goes alone (`repair_done_apart`).
        assert!(c.cluster.vsync.repair_done_apart);
        assert!(
            !DaemonConfig::parse("")
                .unwrap()
                .cluster
                .vsync
                .repair_done_apart
        );
        let c = DaemonConfig::parse(&format!("engine_datagram = 1472\n{lan}")).unwrap();
        assert!(!c.cluster.vsync.repair_done_apart, "whole datagrams");
        assert_eq!(
            engine(&c),
            1_472 - crate::OVERHEAD,
            "fits the path: sealed whole"
        );
        assert!(c.cluster.vsync.max_payload() < 1_472);
        let c = DaemonConfig::parse(&format!("engine_datagram = 65507\n{lan}")).unwrap();
        assert_eq!(engine(&c), 65_507);
        let c = DaemonConfig::parse(&format!("listen = \"[fd00::1]:4804\"\n{KEY}")).unwrap();
        assert_eq!(c.datagram_size(), 1_452);
        let c = DaemonConfig::parse(&format!("max_datagram = 8972\n{lan}")).unwrap();
        assert_eq!(engine(&c), LAN_ENGINE_DATAGRAM);
        let c = DaemonConfig::parse(&format!("max_datagram = 32000\n{lan}")).unwrap();
        assert_eq!(
            engine(&c),
            32_000 - crate::OVERHEAD,
            "the path is larger: no fragments"
        );
        // An explicit engine size is kept if it fits, refused if not.
        let c = DaemonConfig::parse(&format!(
            "{lan}[cluster.vsync.pbcast]\nmax_datagram_size = 1000\n"
        ))
        .unwrap();
        assert_eq!(engine(&c), 1000);
        let e = error(&format!(
            "engine_datagram = 1472\n{lan}[cluster.vsync.pbcast]\nmax_datagram_size = 1460\n"
        ));
        assert!(
            e.contains("`cluster.vsync.pbcast.max_datagram_size`") && e.contains("max_datagram"),
            "{e}"
        );
        for bad in ["max_datagram = 100", "max_datagram = 65508"] {
            assert!(error(bad).contains("`max_datagram`"), "{bad}");
        }
        for bad in ["engine_datagram = 100", "engine_datagram = 65508"] {
            assert!(error(bad).contains("`engine_datagram`"), "{bad}");
        }
    }

    #[test]
    fn the_multicast_interface_and_ttl_are_settings_defaulting_to_loopback() {
        let c = DaemonConfig::parse("multicast = \"239.255.7.7:9100\"").unwrap();
        assert_eq!(c.multicast_options().unwrap(), MulticastOptions::default());
        let lan = format!("listen = \"10.0.0.1:4804\"\nmulticast = \"239.255.7.7:9100\"\n{KEY}");
        let c = DaemonConfig::parse(&format!(
            "{lan}[ip_multicast]\ninterface = \"10.0.0.1\"\nttl = 1\n"
        ))
        .unwrap();
        let o = c.socket_options().unwrap().multicast;
        assert_eq!(
            o.interface,
            MulticastInterface::V4(Ipv4Addr::new(10, 0, 0, 1))
        );
        assert_eq!(o.ttl, 1);
        for (text, key) in [
            // LAN interface, TTL 0: would never leave the host.
            (format!("{lan}[ip_multicast]\ninterface = \"10.0.0.1\"\n"), "`ip_multicast.ttl`"),
            // LAN `listen`, loopback interface.
            (lan.clone(), "`ip_multicast.interface`"),
            (format!("{lan}[ip_multicast]\ninterface = \"eth0\"\nttl = 1\n"), "`ip_multicast.interface`"),
            (format!("{lan}[ip_multicast]\ninterface = \"10.0.0.1\"\nttl = 256\n"), "`ip_multicast.ttl`"),
            ("[ip_multicast]\nttl = 1\n".to_string(), "`ip_multicast`"),
            (
                format!("listen = \"10.0.0.1:4804\"\nmulticast = \"[ff05::7]:9100\"\n{KEY}[ip_multicast]\ninterface = \"eth0\"\nttl = 1\n"),
                "`multicast`",
            ),
            (
                format!("listen = \"[fd00::1]:4804\"\nmulticast = \"[ff05::7]:9100\"\n{KEY}[ip_multicast]\nttl = 1\n"),
                "`ip_multicast.interface`",
            ),
            (
                format!("listen = \"[fd00::1]:4804\"\nmulticast = \"[ff05::7]:9100\"\n{KEY}[ip_multicast]\ninterface = \"wlan9\"\nttl = 1\n"),
                "`ip_multicast.interface`",
            ),
        ] {
            let e = error(&text);
            assert!(e.contains(key), "{text}: {e}");
        }
        // IPv6: an interface name resolved to its index, or the index.
        for (interface, index) in [("eth0", 2), ("br0", 7), ("3", 3)] {
            let c = DaemonConfig::parse_with(
                &format!("listen = \"[fd00::1]:4804\"\ndiscovery = \"[ff02::77]:9100\"\nslot = 1\n{KEY}[ip_multicast]\ninterface = \"{interface}\"\nttl = 1\n"),
                &HOSTS,
            )
            .unwrap();
            let o = c.multicast_options().unwrap();
            assert_eq!(o.interface, MulticastInterface::V6(index));
        }
    }

    #[test]
    fn the_faults_section_is_off_by_default_and_checked() {
        let c = DaemonConfig::parse("").unwrap();
        assert!(!c.fault_config(1).is_active());
        let c = DaemonConfig::parse(
            "[faults]\nloss = 0.02\nduplicate = 0.01\ndelay_ms = 5\njitter_ms = 10\n",
        )
        .unwrap();
        let f = c.fault_config(42);
        assert!(f.is_active());
        assert_eq!(f.drop_probability, 0.02);
        assert_eq!(f.duplicate_probability, 0.01);
        assert_eq!(f.delay, Duration::from_millis(5));
        assert_eq!(f.jitter, Duration::from_millis(10));
        assert_eq!(f.seed, 42);
        let c = DaemonConfig::parse("[faults]\nseed = 7\nloss = 0.5").unwrap();
        assert_eq!(c.fault_config(42).seed, 7);
        let c = DaemonConfig::parse("[faults]\nsend_loss = 0.1\nsend_duplicate = 0.05").unwrap();
        let f = c.fault_config(1);
        assert!(f.is_active());
        assert_eq!(f.send_drop_probability, 0.1);
        assert_eq!(f.send_duplicate_probability, 0.05);
        assert_eq!(f.drop_probability, 0.0);
        for (text, key) in [
            ("[faults]\nloss = 1.0", "`faults.loss`"),
            ("[faults]\nduplicate = -0.1", "`faults.duplicate`"),
            ("[faults]\nsend_loss = 2", "`faults.send_loss`"),
            ("[faults]\nsend_duplicate = 1.0", "`faults.send_duplicate`"),
            ("[faults]\nlos = 0.1", "los"),
        ] {
            let e = error(text);
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn a_socket_error_names_the_setting() {
        // 192.0.2.1 (TEST-NET-1) is no address of this host.
        let c =
            DaemonConfig::parse("listen = \"192.0.2.1:4804\"\ninsecure_no_auth = true").unwrap();
        let e = c.bind().unwrap_err().to_string();
        assert!(
            e.contains("`listen`") && e.contains("192.0.2.1:4804"),
            "{e}"
        );
        let c = DaemonConfig::parse("listen = \"127.0.0.1:0\"");
        assert!(c.is_err());
        let c = DaemonConfig::parse(
            "listen = \"127.0.0.1:4804\"\nmulticast = \"239.255.7.7:9100\"\ninsecure_no_auth = true\n[ip_multicast]\ninterface = \"192.0.2.1\"\nttl = 1\n",
        )
        .unwrap();
        // The unicast socket refuses an IP_MULTICAST_IF that is no local
        // address, or the join does: either way, a setting is named.
        let e = c.bind().unwrap_err().to_string();
        assert!(e.contains("`listen`") || e.contains("`multicast`"), "{e}");
    }

    #[test]
    fn a_file_error_names_the_file_and_the_setting() {
        let dir = std::env::temp_dir().join(format!("shoal-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        std::fs::write(&path, "listen = \"10.0.0.1:4804\"\n").unwrap();
        let e = DaemonConfig::load_with(&path, &HOSTS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.toml") && e.contains("`auth`"), "{e}");
        std::fs::write(&path, "listen = \"ghost:4804\"\n").unwrap();
        let e = DaemonConfig::load_with(&path, &HOSTS)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bad.toml") && e.contains("`listen`") && e.contains("ghost"),
            "{e}"
        );
        std::fs::write(&path, "[limits]\nclient_queues = 3\n").unwrap();
        let e = DaemonConfig::load_with(&path, &HOSTS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.toml") && e.contains("client_queues"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
