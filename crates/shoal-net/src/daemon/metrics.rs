//! The metrics listener (`[metrics] address`): the Prometheus text at
//! `GET /metrics`, and the status page: `GET /` (or `/status`), a plain
//! HTML page whose small script fetches `GET /status.json` every two
//! seconds (members, groups and their members, clients, rates, drops, the
//! quorum flag, the view history; docs/daemon.md).
//!
//! A scrape runs on the node with the daemon engine and the runtime's
//! counters; the figures are snapshots of the counters the daemon keeps
//! anyway, the Prometheus text rendered with `prometheus-client`.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

use serde_json::{json, Value};
use shoal_core::daemon::{daemon_name, Daemon, Membership, MembershipChange, SessionStats};
use shoal_core::{Engine, NodeId};
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

/// Things dropped or refused, by reason (the metric `drops` and the status
/// page's table).
fn drop_counts(
    core: &CoreFigures,
    engine: &Membership,
    rt: &RuntimeStats,
) -> [(&'static str, u64); 10] {
    let s = engine.vsync().stats();
    [
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
    ]
}

fn names(ids: &[NodeId]) -> Vec<String> {
    ids.iter().map(|id| daemon_name(*id)).collect()
}

/// The status page's data: one JSON object (docs/daemon.md lists its
/// fields). `listeners` are the daemon's status lines about its sockets.
/// Runs on the node thread with the engine.
pub fn status_json(
    d: &Daemon,
    now: shoal_core::Instant,
    runtime: &RuntimeStats,
    listeners: &[String],
) -> String {
    let core = figures(d);
    let engine = d.membership();
    let v = engine.vsync();
    let s = v.stats();
    let sessions = d.sessions();
    let ms = |t: shoal_core::Instant| t.as_nanos() / 1_000_000;
    let groups: Vec<Value> = sessions
        .group_members()
        .map(|(name, members)| json!({ "name": name, "members": members }))
        .collect();
    let clients: Vec<Value> = sessions
        .local_clients()
        .map(|(id, name, groups)| {
            json!({ "name": name, "groups": groups, "queued_bytes": d.client_queued(id) })
        })
        .collect();
    let history: Vec<Value> = d
        .view_history()
        .map(|r| match &r.change {
            MembershipChange::View(view) => json!({
                "at_ms": ms(r.at),
                "kind": "view",
                "view": view.id,
                "reason": format!("{:?}", view.reason).to_lowercase(),
                "members": names(&view.members),
                "joined": names(&view.joined),
                "left": names(&view.left),
                "failed": names(&view.failed),
                "quorum": r.quorum,
            }),
            MembershipChange::Removed { view, reason } => json!({
                "at_ms": ms(r.at),
                "kind": "removed",
                "view": view,
                "reason": format!("{reason:?}").to_lowercase(),
                "quorum": r.quorum,
            }),
        })
        .collect();
    let drops: serde_json::Map<String, Value> = drop_counts(&core, engine, runtime)
        .into_iter()
        .map(|(k, n)| (k.to_string(), Value::from(n)))
        .collect();
    let c = &core.stats;
    json!({
        "node": d.settings().node,
        "id": daemon_name(d.node_id()),
        "now_ms": ms(now),
        "member": engine.is_member(),
        "accepting_clients": sessions.ready(),
        "quorum": sessions.quorum(),
        "view": {
            "id": v.view_id(),
            "daemons": names(v.members()),
            "committee": names(v.committee()),
        },
        "listeners": listeners,
        "groups": groups,
        "clients": clients,
        "counters": {
            "client_messages_sent": c.messages_sent,
            "client_messages_delivered": c.messages_delivered,
            "group_changes": c.group_changes,
            "deliveries": s.delivered,
            "view_changes": s.views_installed,
            "datagrams_sent": runtime.datagrams_sent,
            "datagrams_received": runtime.datagrams_received,
            "bytes_sent": runtime.bytes_sent,
            "bytes_received": runtime.bytes_received,
        },
        "gauges": {
            "clients": core.clients,
            "groups": core.groups,
            "pending_bytes": core.pending_bytes,
            "client_queue_bytes": core.client_queue_bytes,
            "resident_bytes": resident_bytes(),
        },
        "drops": drops,
        "history": history,
    })
    .to_string()
}

/// The status page: static HTML with its script (no framework); the data
/// comes from `/status.json`.
pub const STATUS_PAGE: &str = include_str!("status.html");

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
    counter(
        &mut r,
        "view_acks_asked_again",
        "silent daemons this daemon, as primary, heard during a view change and asked once more instead of dropping them",
        s.view_acks_asked_again,
    );
    gauge(
        &mut r,
        "view_members",
        "daemons in the current view",
        v.members().len() as u64,
    );
    let drops = Family::<ReasonLabel, Counter<u64>>::default();
    for (reason, n) in drop_counts(core, engine, runtime) {
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

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Metrics,
    Page,
    Json,
    NotFound,
}

/// The route of a request's head (`GET <path> HTTP/1.x`; a query string
/// is ignored).
fn route(head: &str) -> Route {
    let Some(rest) = head.strip_prefix("GET ") else {
        return Route::NotFound;
    };
    let target = rest.split(' ').next().unwrap_or("");
    match target.split('?').next().unwrap_or("") {
        "/metrics" => Route::Metrics,
        "/" | "/status" => Route::Page,
        "/status.json" => Route::Json,
        _ => Route::NotFound,
    }
}

/// Runs `f` on the node with the engine and returns what it made (empty if
/// the node has stopped).
async fn on_node(
    scrapes: &mpsc::UnboundedSender<Control<Daemon>>,
    f: impl FnOnce(&mut Daemon, shoal_core::Instant, &RuntimeStats) -> String + Send + 'static,
) -> String {
    let (tx, rx) = oneshot::channel();
    let scrape = move |d: &mut Daemon, now, runtime: &RuntimeStats| {
        let _ = tx.send(f(d, now, runtime));
    };
    match scrapes.send(Box::new(scrape)) {
        Ok(()) => rx.await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

fn ok(content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncache-control: no-store\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Serves `GET /metrics`, the status page (`/`, `/status`) and its data
/// (`/status.json`); anything else gets 404. Runs until the runtime stops;
/// each scrape runs on the node with the engine. `listeners` are the
/// daemon's status lines about its sockets, for the page.
pub async fn serve(
    listener: TcpListener,
    scrapes: mpsc::UnboundedSender<Control<Daemon>>,
    listeners: Arc<Vec<String>>,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let scrapes = scrapes.clone();
        let listeners = listeners.clone();
        tokio::spawn(async move {
            // The request line, however the client's writes cut it (at
            // most 4 KiB, which is plenty for these paths).
            let mut request = vec![0u8; 4096];
            let mut n = 0;
            while n < request.len() && !request[..n].windows(2).any(|w| w == b"\r\n") {
                match stream.read(&mut request[n..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(more) => n += more,
                }
            }
            let head = String::from_utf8_lossy(&request[..n]);
            let response = match route(&head) {
                Route::Metrics => {
                    let body = on_node(&scrapes, |d, _now, runtime| {
                        render(&figures(d), d.membership(), runtime)
                    })
                    .await;
                    ok(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        &body,
                    )
                }
                Route::Json => {
                    let body = on_node(&scrapes, move |d, now, runtime| {
                        status_json(d, now, runtime, &listeners)
                    })
                    .await;
                    ok("application/json", &body)
                }
                Route::Page => ok("text/html; charset=utf-8", STATUS_PAGE),
                Route::NotFound => {
                    "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        .to_string()
                }
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_routed_by_path() {
        for (head, want) in [
            ("GET /metrics HTTP/1.1\r\n", Route::Metrics),
            ("GET / HTTP/1.1\r\nhost: x\r\n", Route::Page),
            ("GET /status HTTP/1.0\r\n", Route::Page),
            ("GET /status.json?t=5 HTTP/1.1\r\n", Route::Json),
            ("GET /other HTTP/1.1\r\n", Route::NotFound),
            ("POST /metrics HTTP/1.1\r\n", Route::NotFound),
            ("", Route::NotFound),
        ] {
            assert_eq!(route(head), want, "{head:?}");
        }
    }

    #[test]
    fn the_page_fetches_the_json_and_shows_every_part() {
        assert!(STATUS_PAGE.contains("fetch(\"status.json"));
        for id in [
            "quorum", "daemons", "groups", "clients", "rates", "drops", "history",
        ] {
            assert!(STATUS_PAGE.contains(&format!("id=\"{id}\"")), "{id}");
        }
    }
}
