//! The Prometheus text endpoint (`[metrics] address`): `GET /metrics`.
//!
//! A scrape runs on the node with the daemon engine and the runtime's
//! counters; the figures are snapshots of the
//! counters the daemon keeps anyway, rendered with `prometheus-client`.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use shoal_core::daemon::{Daemon, Membership, SessionStats};
use shoal_wire::Kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use crate::{Control, RuntimeStats};

/// The sessions' side of a scrape.
#[derive(Debug, Clone, Default)]
pub struct CoreFigures {
    pub stats: SessionStats,
    pub clients: u64,
    pub groups: u64,
    pub pending_bytes: u64,
    pub client_queue_bytes: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(value);
    registry.register(name, help, c);
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let g = Gauge::<i64>::default();
    g.set(i64::try_from(value).unwrap_or(i64::MAX));
    registry.register(name, help, g);
}

/// Resident memory of this process (Linux), in bytes.
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The daemon engine's figures.
pub fn figures(daemon: &Daemon) -> CoreFigures {
    let sessions = daemon.sessions();
    CoreFigures {
        stats: sessions.stats().clone(),
        clients: sessions.clients() as u64,
        groups: sessions.groups() as u64,
        pending_bytes: sessions.pending_bytes() as u64,
        client_queue_bytes: daemon.client_queue_bytes() as u64,
    }
}

/// Renders every metric; runs on the node thread with the engine.
pub fn render(core: &CoreFigures, engine: &Membership, runtime: &RuntimeStats) -> String {
    let mut r = Registry::with_prefix("shoal");
    let v = engine.vsync();
    let s = v.stats();
    let rt = runtime;
    counter(
        &mut r,
        "datagrams_sent",
        "UDP datagrams sent to peer daemons",
        rt.datagrams_sent,
    );
    counter(
        &mut r,
        "datagrams_received",
        "UDP datagrams received",
        rt.datagrams_received,
    );
    counter(&mut r, "bytes_sent", "UDP bytes sent", rt.bytes_sent);
    counter(
        &mut r,
        "bytes_received",
        "UDP bytes received",
        rt.bytes_received,
    );
    if let Some(p) = v.pbcast_stats() {
        let sent = Family::<KindLabel, Counter<u64>>::default();
        let received = Family::<KindLabel, Counter<u64>>::default();
        for kind in Kind::ALL {
            let label = KindLabel {
                kind: kind.name().to_string(),
            };
            sent.get_or_create(&label)
                .inc_by(p.packets_sent[kind.index()]);
            received
                .get_or_create(&label)
                .inc_by(p.packets_received[kind.index()]);
        }
        r.register("packets_sent", "pbcast packets sent, by kind", sent);
        r.register(
            "packets_received",
            "pbcast packets received, by kind",
            received,
        );
        counter(
            &mut r,
            "pbcast_recovered",
            "messages pbcast recovered by gossip repair",
            p.recovered,
        );
        counter(
            &mut r,
            "pbcast_lost",
            "messages pbcast declared lost",
            p.lost,
        );
    }
    counter(
        &mut r,
        "vsync_datagrams_sent",
        "vsync control datagrams sent",
        s.vsync_datagrams_sent,
    );
    counter(
        &mut r,
        "deliveries",
        "daemon messages delivered in the total order",
        s.delivered,
    );
    counter(&mut r, "repairs_sent", "vsync repairs sent", s.repairs_sent);
    counter(
        &mut r,
        "repair_requests_sent",
        "vsync repair requests sent",
        s.repair_requests_sent,
    );
    counter(
        &mut r,
        "view_changes",
        "daemon views installed",
        s.views_installed,
    );
    counter(
        &mut r,
        "takeovers",
        "committee takeovers by this daemon",
        s.takeovers,
    );
    counter(
        &mut r,
        "newviews_abandoned",
        "view changes this daemon abandoned as primary: another proposer's Newview may have been chosen",
        s.newviews_abandoned,
    );
    gauge(
        &mut r,
        "view_members",
        "daemons in the current view",
        v.members().len() as u64,
    );
    let drops = Family::<ReasonLabel, Counter<u64>>::default();
    for (reason, n) in [
        ("unknown_source", rt.unknown_source),
        ("slot_conflict", rt.slot_conflicts),
        ("failed_authentication", rt.auth_dropped),
        ("io_error", rt.io_errors),
        ("too_large", rt.too_large),
        ("malformed_vsync", s.malformed),
        ("malformed_batch", core.stats.malformed_batches),
        ("slow_client", core.stats.slow_clients),
        ("injected_loss", rt.fault_drops),
        ("injected_send_loss", rt.fault_send_drops),
    ] {
        drops
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc_by(n);
    }
    r.register("drops", "things dropped or refused, by reason", drops);
    let c = &core.stats;
    counter(
        &mut r,
        "client_messages_sent",
        "messages clients of this daemon sent",
        c.messages_sent,
    );
    counter(
        &mut r,
        "client_messages_delivered",
        "messages delivered to clients of this daemon",
        c.messages_delivered,
    );
    counter(
        &mut r,
        "group_changes",
        "lightweight group membership changes",
        c.group_changes,
    );
    gauge(&mut r, "clients", "connected clients", core.clients);
    gauge(&mut r, "groups", "groups in the cluster", core.groups);
    gauge(
        &mut r,
        "pending_bytes",
        "client items waiting for the daemons' group",
        core.pending_bytes,
    );
    gauge(
        &mut r,
        "client_queue_bytes",
        "bytes queued to clients, all clients",
        core.client_queue_bytes,
    );
    let held = v.buffered();
    gauge(
        &mut r,
        "vsync_store_records",
        "records in this daemon's committee store (0 outside the committee)",
        held.committee_records as u64,
    );
    gauge(
        &mut r,
        "vsync_store_bytes",
        "payload bytes of the committee store's records",
        held.committee_bytes as u64,
    );
    gauge(
        &mut r,
        "vsync_pending_records",
        "records received ahead of the next to deliver",
        held.pending_records as u64,
    );
    gauge(
        &mut r,
        "pbcast_buffered_messages",
        "messages pbcast keeps for gossip repair",
        held.pbcast_messages as u64,
    );
    gauge(
        &mut r,
        "resident_bytes",
        "resident memory of the daemon process",
        resident_bytes(),
    );
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &r);
    out
}

/// Serves `GET /metrics` (anything else gets 404) until the runtime stops;
/// each scrape runs on the node with the engine.
pub async fn serve(listener: TcpListener, scrapes: mpsc::UnboundedSender<Control<Daemon>>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let scrapes = scrapes.clone();
        tokio::spawn(async move {
            let mut request = vec![0u8; 4096];
            let Ok(n) = stream.read(&mut request).await else {
                return;
            };
            let head = String::from_utf8_lossy(&request[..n]);
            let response = if head.starts_with("GET /metrics ") {
                let (tx, rx) = oneshot::channel();
                let scrape = move |d: &mut Daemon, _now, runtime: &RuntimeStats| {
                    let _ = tx.send(render(&figures(d), d.membership(), runtime));
                };
                let body = match scrapes.send(Box::new(scrape)) {
                    Ok(()) => rx.await.unwrap_or_default(),
                    Err(_) => String::new(),
                };
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_string()
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}
