//! The webhook deliverer: sends the outbox's due deliveries (written by the commands in the
//! same transaction as the job changes they report), signed with HMAC-SHA256, where the
//! destination policy allows (`starbridge_core::destination`): the URL's host is checked before
//! sending, every address a host name resolves to on every new connection, and no redirect is
//! followed. Each attempt is recorded; the outbox decides when the next one is due.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use starbridge_core::destination::{DestinationPolicy, Verdict, redact_url};
pub use starbridge_egress::Refused;
use starbridge_egress::{failure, guarded_client, refused_in};
use tokio::sync::watch;

use crate::{Attempt, DueDelivery, Engine};

/// Most deliveries sent per pass of the deliverer.
const BATCH: u32 = 50;
/// How long a receiver has to answer.
const SEND_TIMEOUT: StdDuration = StdDuration::from_secs(10);
const _: () = assert!(
    SEND_TIMEOUT.as_millis() * 3 < crate::DELIVERY_LEASE.as_millis() as u128,
    "a claimed delivery must be sent well within its lease"
);
/// Longest sleep of the deliverer without a wake-up (a guard, not the main path).
const MAX_SLEEP: StdDuration = StdDuration::from_secs(5);
/// The server flag that opens destinations the policy refuses by default.
pub const ALLOW_FLAG: &str = "--webhook-allow";

/// The `Starbridge-Signature` header value for `body` sent at `unix_seconds`.
pub fn signature(secret: &str, unix_seconds: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(unix_seconds.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("t={unix_seconds},v1={hex}")
}

/// The deliverer's HTTP client: connects only where `policy` allows, follows no redirect.
fn delivery_client(policy: Arc<DestinationPolicy>) -> reqwest::Result<reqwest::Client> {
    guarded_client(policy).timeout(SEND_TIMEOUT).build()
}

/// Sends one delivery and says how it went. A destination the policy refuses is not connected
/// to: its host here, or every address its name resolves to (in `PolicyResolver`).
async fn send(
    http: &reqwest::Client,
    policy: &DestinationPolicy,
    store: &Engine,
    due: &DueDelivery,
) -> Attempt {
    let url = match reqwest::Url::parse(&due.url) {
        Ok(url) => url,
        Err(error) => {
            return Attempt::Failed {
                status: None,
                error: format!("could not deliver: the URL is not valid ({error})"),
            };
        }
    };
    if let Verdict::Refused(refusal) = policy.check_url(&url) {
        return Attempt::Refused {
            error: refused_error(&Refused {
                name: None,
                refusal,
            }),
        };
    }
    let body = serde_json::to_vec(&due.delivery.payload).unwrap_or_default();
    let now_seconds = store.now().0.div_euclid(1000);
    let result = http
        .post(url)
        .header("content-type", "application/json")
        .header(
            "starbridge-signature",
            signature(&due.secret, now_seconds, &body),
        )
        .header("starbridge-delivery", due.delivery.id.to_string())
        .header("starbridge-event", event_of(&due.delivery.payload))
        .body(body)
        .send()
        .await;
    match result {
        Ok(response) if response.status().is_success() => Attempt::Delivered {
            status: response.status().as_u16(),
        },
        Ok(response) if response.status().is_redirection() => Attempt::Failed {
            status: Some(response.status().as_u16()),
            error: format!(
                "the receiver answered {} (redirects are not followed)",
                response.status()
            ),
        },
        Ok(response) => Attempt::Failed {
            status: Some(response.status().as_u16()),
            error: format!("the receiver answered {}", response.status()),
        },
        Err(error) => match refused_in(&error) {
            Some(refused) => Attempt::Refused {
                error: refused_error(refused),
            },
            None => Attempt::Failed {
                status: None,
                error: format!("could not deliver: {}", failure(error)),
            },
        },
    }
}

/// What a message reports, for its `Starbridge-Event` header: its body's `type`.
fn event_of(payload: &serde_json::Value) -> &str {
    payload["type"]
        .as_str()
        .unwrap_or(starbridge_core::webhook::WebhookEvent::JobStatusChanged.as_str())
}

/// The error recorded for a refused delivery.
fn refused_error(refused: &Refused) -> String {
    format!("{refused} (not sent; {ALLOW_FLAG} opens it)")
}

/// Sends due deliveries until `stop`, where `policy` allows; sleeps until the next retry or a
/// new delivery.
pub async fn run_deliveries(
    store: Engine,
    policy: Arc<DestinationPolicy>,
    mut stop: watch::Receiver<bool>,
) {
    let http = match delivery_client(policy.clone()) {
        Ok(http) => http,
        Err(error) => {
            tracing::error!(%error, "webhook deliverer cannot start");
            return;
        }
    };
    let changed = store.notifier().deliveries();
    loop {
        if *stop.borrow() {
            return;
        }
        let notified = changed.notified();
        let sent = match store.claim_deliveries(BATCH).await {
            Ok(due) => {
                let count = due.len();
                // Sent side by side: one slow receiver does not hold up the others, and every
                // claimed delivery is sent well within its lease.
                let mut sending = tokio::task::JoinSet::new();
                for delivery in due {
                    let (http, policy, store) = (http.clone(), policy.clone(), store.clone());
                    sending.spawn(async move {
                        let attempt = send(&http, &policy, &store, &delivery).await;
                        if let Attempt::Failed { error, .. } | Attempt::Refused { error } = &attempt
                        {
                            // The URL without its path and query, which may hold secrets.
                            tracing::warn!(
                                delivery = delivery.delivery.id,
                                webhook = %delivery.delivery.webhook_id,
                                url = %redact_url(&delivery.url),
                                %error,
                                "webhook delivery failed"
                            );
                        }
                        if let Err(error) =
                            store.record_delivery(delivery.delivery.id, attempt).await
                        {
                            tracing::warn!(%error, "cannot record a webhook delivery");
                        }
                    });
                }
                while sending.join_next().await.is_some() {}
                count
            }
            Err(error) => {
                tracing::warn!(%error, "webhook deliverer: database error");
                0
            }
        };
        if sent as u32 == BATCH {
            continue;
        }
        let sleep = match store.next_delivery().await {
            Ok(Some(next)) => {
                StdDuration::from_millis(next.since(store.now()).as_millis()).min(MAX_SLEEP)
            }
            _ => MAX_SLEEP,
        };
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep(sleep) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_sha256_over_time_and_body() {
        // Known answer computed independently (`printf "1700000000.{}" | openssl dgst -sha256 -hmac secret`).
        let header = signature("secret", 1700000000, b"{}");
        assert_eq!(
            header,
            "t=1700000000,v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
        );
    }
}
