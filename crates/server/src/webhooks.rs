//! Webhooks: the subscription endpoints and the deliverer, which sends the store's outbox.
//!
//! Each message is `POST`ed as JSON with `Starbridge-Signature: t=<unix seconds>,v1=<hex>`, where
//! `<hex>` is HMAC-SHA256 with the subscription's secret over `"<t>.<body>"`; receivers recompute
//! it and may reject old `t` values to resist replays. `Starbridge-Delivery` carries the delivery
//! id, stable across retries, so receivers can drop duplicates (delivery is at least once).

use std::time::Duration as StdDuration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use starbridge_api as api;
use starbridge_core::model::JobStatus;
use starbridge_store::{Attempt, Delivery, DueDelivery, Store, Webhook};
use tokio::sync::watch;

use crate::error::{ApiError, ApiResult};
use crate::limits::Limit;
use crate::routes::{AppState, body, namespace};

/// Most deliveries sent per pass of the deliverer.
const BATCH: u32 = 50;
/// How long a receiver has to answer.
const SEND_TIMEOUT: StdDuration = StdDuration::from_secs(10);
const _: () = assert!(
    SEND_TIMEOUT.as_millis() * 3 < starbridge_store::DELIVERY_LEASE.as_millis() as u128,
    "a claimed delivery must be sent well within its lease"
);
/// Longest sleep of the deliverer without a wake-up (a guard, not the main path).
const MAX_SLEEP: StdDuration = StdDuration::from_secs(5);

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/v1/webhooks", get(list).post(create))
        .route("/api/v1/webhooks/{id}", delete(remove))
        .route("/api/v1/webhooks/{id}/deliveries", get(deliveries))
}

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

fn view(webhook: &Webhook, with_secret: bool) -> api::WebhookView {
    api::WebhookView {
        id: webhook.id.clone(),
        namespace: webhook.namespace.clone(),
        url: webhook.url.clone(),
        workflow: webhook.workflow.clone(),
        states: webhook
            .states
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect(),
        created_at: api::timestamp_from_millis(webhook.created_at.0),
        secret: with_secret.then(|| webhook.secret.clone()),
    }
}

fn delivery_view(delivery: &Delivery) -> api::DeliveryView {
    let time = |ts: starbridge_core::time::Timestamp| api::timestamp_from_millis(ts.0);
    let state = match (delivery.delivered_at, delivery.next_attempt_at) {
        (Some(_), _) => "delivered",
        (None, Some(_)) => "pending",
        (None, None) => "failed",
    };
    api::DeliveryView {
        id: delivery.id,
        job_id: delivery.job_id.clone(),
        status: delivery.status.clone(),
        payload: delivery.payload.clone(),
        created_at: time(delivery.created_at),
        attempts: delivery.attempts,
        state: state.to_owned(),
        next_attempt_at: delivery.next_attempt_at.map(time),
        delivered_at: delivery.delivered_at.map(time),
        last_status: delivery.last_status,
        last_error: delivery.last_error.clone(),
    }
}

async fn create(
    State(state): State<AppState>,
    Query(query): Query<api::NamespaceQuery>,
    bytes: Bytes,
) -> ApiResult<(StatusCode, Json<api::WebhookView>)> {
    let namespace = namespace(&query)?;
    let request: api::WebhookRequest = body(&bytes)?;
    let states = request
        .states
        .iter()
        .map(|text| {
            JobStatus::parse(text).ok_or_else(|| {
                let valid: Vec<&str> = JobStatus::ALL.iter().map(|s| s.as_str()).collect();
                ApiError::invalid(
                    "states",
                    format!("unknown job status '{text}': use {}", valid.join(", ")),
                )
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    let webhook = state
        .store
        .create_webhook(
            &namespace,
            &request.url,
            request.workflow,
            states,
            request.secret,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(view(&webhook, true))))
}

async fn list(
    State(state): State<AppState>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::WebhookList>> {
    let namespace = namespace(&query)?;
    let webhooks = state.store.webhooks(&namespace).await?;
    Ok(Json(api::WebhookList {
        items: webhooks.iter().map(|w| view(w, false)).collect(),
    }))
}

async fn remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<StatusCode> {
    let namespace = namespace(&query)?;
    state.store.delete_webhook(&namespace, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct DeliveriesQuery {
    namespace: Option<String>,
    limit: Option<u32>,
}

async fn deliveries(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<DeliveriesQuery>,
) -> ApiResult<Json<api::DeliveryList>> {
    let namespace = namespace(&api::NamespaceQuery {
        namespace: query.namespace,
    })?;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 {
        return Err(ApiError::invalid("limit", "must be at least 1"));
    }
    state
        .limits
        .count(Limit::Page, "limit", u64::from(limit), "items")?;
    let deliveries = state
        .store
        .deliveries(&namespace, &id, limit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("webhook {id} not found")))?;
    Ok(Json(api::DeliveryList {
        items: deliveries.iter().map(delivery_view).collect(),
    }))
}

/// Sends one delivery and says how it went.
async fn send(http: &reqwest::Client, store: &Store, due: &DueDelivery) -> Attempt {
    let body = serde_json::to_vec(&due.delivery.payload).unwrap_or_default();
    let now_seconds = store.now().0.div_euclid(1000);
    let result = http
        .post(&due.url)
        .header("content-type", "application/json")
        .header(
            "starbridge-signature",
            signature(&due.secret, now_seconds, &body),
        )
        .header("starbridge-delivery", due.delivery.id.to_string())
        .header("starbridge-event", "job.status_changed")
        .body(body)
        .send()
        .await;
    match result {
        Ok(response) if response.status().is_success() => Attempt::Delivered {
            status: response.status().as_u16(),
        },
        Ok(response) => Attempt::Failed {
            status: Some(response.status().as_u16()),
            error: format!("the receiver answered {}", response.status()),
        },
        Err(error) => Attempt::Failed {
            status: None,
            error: format!("could not deliver: {error}"),
        },
    }
}

/// Sends due deliveries until `stop`; sleeps until the next retry or a new delivery.
pub async fn run_deliveries(store: Store, mut stop: watch::Receiver<bool>) {
    crate::tls::install_crypto_provider();
    let http = match reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        // A redirect would turn the POST into a body-less GET: report it as a failure instead.
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("starbridge/", env!("CARGO_PKG_VERSION")))
        .build()
    {
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
                    let (http, store) = (http.clone(), store.clone());
                    sending.spawn(async move {
                        let attempt = send(&http, &store, &delivery).await;
                        if let Attempt::Failed { error, .. } = &attempt {
                            tracing::warn!(delivery = delivery.delivery.id, url = %delivery.url, %error, "webhook delivery failed");
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
