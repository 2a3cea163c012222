//! The daemon's TOML configuration (`shoal daemon --config shoal.toml`).
//!
//! Unknown keys are refused (`deny_unknown_fields`), and a parse error names
//! the offending key. Every setting has a default; an empty file is valid.
//!
//! ```toml
//! node = "a"
//! socket = "/tmp/shoal-a.sock"      # default: $XDG_RUNTIME_DIR/shoal.sock, else /tmp/shoal-<uid>.sock
//! listen = "127.0.0.1:9000"         # daemon's UDP address for peer daemons
//! peers = ["127.0.0.1:9001", "127.0.0.1:9002"]
//! multicast = "239.255.77.1:9100"  # optional: pbcast's first phase by IP multicast
//!
//! # Or, instead of `peers`, find the other daemons by IP multicast:
//! # discovery = "239.255.77.1:9100"  # admin-scoped group with a port (loopback, TTL 0);
//! #                                  # if `multicast` is set too, the same address
//! # slot = 0                         # required with `discovery`: 0..=255, unique in the cluster
//!
//! [tcp]                             # optional
//! address = "127.0.0.1:4803"
//! token = "secret"
//!
//! [limits]
//! clients = 1024
//! groups_per_client = 256
//! group_name_len = 128
//! message_size = 1048576
//! client_queue = 33554432          # bytes
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;
use thiserror::Error;

/// Why a configuration was refused.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid configuration: `{key}` {why}")]
    Invalid { key: &'static str, why: String },
}

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
    /// UDP address this daemon uses to talk to its peer daemons (loopback).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// The static set of peer daemons' UDP addresses (loopback).
    #[serde(default)]
    pub peers: Vec<SocketAddr>,
    /// The transport of pbcast's first phase: unset, unicast (a relay tree,
    /// `relay_fanout`); set, IP multicast to this group, an admin-scoped
    /// address (239.255.0.0/16) with a port. Every multicast socket is
    /// pinned to loopback with TTL 0: no datagram leaves the host.
    #[serde(default)]
    pub multicast: Option<SocketAddr>,
    /// Find the peer daemons by IP multicast to this group (admin-scoped,
    /// with a port, pinned to loopback like `multicast`) instead of a
    /// static `peers` list, which must then be empty. Needs `slot`; if
    /// `multicast` is set too it must be the same address (a node has one
    /// group). Does not by itself move pbcast's first phase to IP multicast.
    #[serde(default)]
    pub discovery: Option<SocketAddr>,
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
}

/// `[metrics]`: where to serve the Prometheus text endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// A TCP address on loopback, e.g. "127.0.0.1:9464".
    pub address: SocketAddr,
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

/// `addr` as an admin-scoped IPv4 group with a port; errors name `key`.
fn admin_group(
    key: &'static str,
    addr: Option<SocketAddr>,
) -> Result<Option<crate::MulticastGroup>, ConfigError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let invalid = |why: String| ConfigError::Invalid { key, why };
    let SocketAddr::V4(v4) = addr else {
        return Err(invalid(format!("{addr} is not IPv4")));
    };
    crate::MulticastGroup::new(v4)
        .map(Some)
        .map_err(|_| invalid(format!("{addr} is not in 239.255.0.0/16 with a port")))
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
/// not stop the cluster (P000 §6 measures k = 1); datagrams up to 65,000
/// bytes, since daemons talk over loopback (DESIGN.md "Pack and batch"),
/// leaving room for the authentication envelope; progress reports every
/// 100 ms, so that the committee collects delivered records at once rather
/// than holding every record of a view period (gigabytes at full rate);
/// committee members delivering from their stores (`committee_delivery`),
/// which takes two hops off an ordered message's way to them, and, in a
/// cluster no larger than its committee, the pbcast of every payload.
pub fn default_cluster() -> shoal_core::daemon::membership::Config {
    shoal_core::daemon::membership::Config::daemon_defaults()
}

/// A TCP client listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpConfig {
    pub address: SocketAddr,
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
            slot: None,
            tcp: None,
            limits: Limits::default(),
            cluster: default_cluster(),
            auth: None,
            metrics: None,
        }
    }
}

impl DaemonConfig {
    /// Parses and validates a configuration text.
    pub fn parse(text: &str) -> Result<DaemonConfig, ConfigError> {
        // Parse once for syntax and unknown keys with their positions.
        let config: DaemonConfig = toml::from_str(text)?;
        let config = match toml::from_str::<toml::Table>(text)?.remove("cluster") {
            // A `[cluster...]` section must override the daemon's cluster
            // defaults key by key, not reset the section to the engine's
            // defaults (serde fills a present table from `Default`).
            Some(user) => {
                let mut merged =
                    toml::Value::try_from(default_cluster()).map_err(|e| ConfigError::Invalid {
                        key: "cluster",
                        why: e.to_string(),
                    })?;
                overlay(&mut merged, user);
                DaemonConfig {
                    cluster: merged.try_into()?,
                    ..config
                }
            }
            None => config,
        };
        config.validate()?;
        Ok(config)
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

    /// Reads, parses and validates a configuration file.
    pub fn load(path: &std::path::Path) -> Result<DaemonConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        DaemonConfig::parse(&text)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, why: &str| ConfigError::Invalid {
            key,
            why: why.to_string(),
        };
        if self.node.is_empty() {
            return Err(invalid("node", "must not be empty"));
        }
        // Only loopback traffic (the issue's scope for now).
        if self.listen.port() == 0 {
            return Err(invalid(
                "listen",
                "needs a fixed port: peers find this daemon at it",
            ));
        }
        if !self.listen.ip().is_loopback() {
            return Err(invalid("listen", "must be a loopback address"));
        }
        if let Some(p) = self.peers.iter().find(|p| !p.ip().is_loopback()) {
            return Err(invalid("peers", &format!("{p} is not a loopback address")));
        }
        if self.peers.contains(&self.listen) {
            return Err(invalid("peers", "must not contain this daemon's `listen`"));
        }
        self.multicast_group()?;
        self.validate_discovery()?;
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
        if let Some(m) = &self.metrics {
            if !m.address.ip().is_loopback() {
                return Err(invalid("metrics.address", "must be a loopback address"));
            }
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
        assert_eq!(c.cluster.vsync.pbcast.max_datagram_size, 65_000);
        assert_eq!(c.cluster.vsync.progress_interval.as_millis(), 100);
        assert!(c.cluster.vsync.committee_delivery);
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
            ("listen = \"10.0.0.1:1\"", "`listen`"),
            ("peers = [\"10.0.0.1:1\"]", "`peers`"),
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
}
