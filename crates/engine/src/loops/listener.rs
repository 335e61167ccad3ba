//! PostgreSQL: hears what other nodes' commits announce (queues that got work, webhook
//! deliveries written) and wakes this node's long-polls and loops, on a thread of its own.
//!
//! A commit's announcement (`announcements`) is sent with `NOTIFY` on a channel of the schema in
//! the same transaction; each node skips its own.

use std::sync::{Arc, Weak};
use std::time::Duration;

use starbridge_store::postgres::Connector;

use crate::notify::Notifier;

/// What one commit tells the other nodes. Lines: `n <node>` (who sent it, so a node skips its
/// own), `q <namespace> <queue>` (a queue got work), `d` (webhook deliveries were written).
/// Fields are tab-separated; a payload stays under PostgreSQL's 8000-byte limit.
pub(crate) fn announcements<'a>(
    node: &str,
    wakes: impl IntoIterator<Item = &'a (String, String)>,
    deliveries: bool,
) -> Vec<String> {
    const LIMIT: usize = 7900;
    let header = format!("n\t{node}");
    let mut payloads = Vec::new();
    let mut current = header.clone();
    let mut lines: Vec<String> = wakes
        .into_iter()
        .map(|(namespace, queue)| format!("q\t{namespace}\t{queue}"))
        .collect();
    lines.sort();
    lines.dedup();
    if deliveries {
        lines.push("d".to_owned());
    }
    if lines.is_empty() {
        return payloads;
    }
    for line in lines {
        if current.len() + 1 + line.len() > LIMIT {
            payloads.push(std::mem::replace(&mut current, header.clone()));
        }
        current.push('\n');
        current.push_str(&line);
    }
    payloads.push(current);
    payloads
}

/// Applies another node's announcement to this node's notifier.
fn receive(notifier: &Notifier, node: &str, payload: &str) {
    let mut lines = payload.lines();
    if lines.next().and_then(|line| line.strip_prefix("n\t")) == Some(node) {
        return;
    }
    for line in lines {
        let mut fields = line.split('\t');
        match (fields.next(), fields.next(), fields.next()) {
            (Some("q"), Some(namespace), Some(queue)) => notifier.wake(namespace, queue),
            (Some("d"), None, None) => notifier.deliveries_changed(),
            _ => tracing::debug!(line, "unknown announcement line"),
        }
    }
}

/// Listens for other nodes' announcements until the notifier is dropped. When the connection
/// breaks it reconnects with backoff and then wakes every poll and timer of this node, since
/// announcements sent meanwhile are lost.
fn listen(connector: Connector, node: String, notifier: Weak<Notifier>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        if notifier.strong_count() == 0 {
            return;
        }
        let mut conn = match connector.connect() {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "listener cannot reach PostgreSQL; retrying");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Err(error) = conn.listen() {
            tracing::warn!(%error, "LISTEN failed; retrying");
            std::thread::sleep(backoff);
            continue;
        }
        backoff = Duration::from_millis(100);
        match notifier.upgrade() {
            Some(notifier) => {
                notifier.wake_all();
                notifier.timers_changed();
                notifier.deliveries_changed();
            }
            None => return,
        }
        loop {
            // Wake up now and then to notice that the store is gone.
            let next = conn.next_notification(Duration::from_secs(1));
            let Some(notifier) = notifier.upgrade() else {
                return;
            };
            match next {
                Ok(Some(payload)) => receive(&notifier, &node, &payload),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, "listener connection lost; reconnecting");
                    break;
                }
            }
        }
    }
}

/// Starts the listener thread of a node.
pub(crate) fn start(connector: Connector, node: String, notifier: &Arc<Notifier>) {
    let notifier = Arc::downgrade(notifier);
    std::thread::Builder::new()
        .name("starbridge-listen".to_owned())
        .spawn(move || listen(connector, node, notifier))
        .expect("spawning the listener thread");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_skip_duplicates_and_stay_under_the_payload_limit() {
        let wakes: Vec<(String, String)> = (0..400)
            .map(|i| {
                (
                    "default".to_owned(),
                    format!("a-queue-with-a-rather-long-name-{}", i % 200),
                )
            })
            .collect();
        let payloads = announcements("node-a", &wakes, true);
        assert!(payloads.len() > 1);
        assert!(
            payloads
                .iter()
                .all(|p| p.len() < 8000 && p.starts_with("n\tnode-a"))
        );
        let lines: usize = payloads.iter().map(|p| p.lines().count() - 1).sum();
        assert_eq!(lines, 201, "200 distinct queues and the deliveries line");
        assert!(announcements("node-a", &[], false).is_empty());
    }

    #[tokio::test]
    async fn another_nodes_announcement_wakes_its_queue_and_our_own_is_skipped() {
        let notifier = Notifier::default();
        let poll = notifier.register("default", &["q".to_owned()]);
        let payload = &announcements("node-b", &[("default".into(), "q".into())], false)[0];
        receive(&notifier, "node-a", payload);
        poll.notified().await;

        let poll = notifier.register("default", &["q".to_owned()]);
        receive(&notifier, "node-b", payload);
        let woken = tokio::time::timeout(Duration::from_millis(20), poll.notified()).await;
        assert!(
            woken.is_err(),
            "a node's own announcement is not applied twice"
        );
    }
}
