//! Webhooks: the subscription endpoints (create, list, delete, deliveries). The deliverer that
//! sends the outbox is the engine's (`starbridge_engine::loops::deliveries`).
//!
//! Where deliveries may go is the server's destination policy (`--webhook-allow`; see
//! [`starbridge_core::destination`]). The create refuses a destination the policy refuses,
//! resolving a host name to check its addresses; the deliverer checks again before every
//! connection. URLs, which often carry secrets, are shown in full only to callers who may
//! operate.

use starbridge_api::paths;
use std::time::Duration as StdDuration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use starbridge_api as api;
use starbridge_core::definition::Problem;
use starbridge_core::destination::{DestinationPolicy, Verdict, redact_url};
use starbridge_core::model::JobStatus;
use starbridge_core::wire::DeliveryState;
use starbridge_engine::loops::deliveries::{ALLOW_FLAG, Refused};
use starbridge_engine::{Delivery, Scope, Webhook};

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, known, namespace};
use crate::limits::Limit;
use crate::state::AppState;

/// How long the create waits for a host name to resolve before leaving the check to delivery.
const CREATE_RESOLVE_TIMEOUT: StdDuration = StdDuration::from_secs(5);

/// Refuses a subscription whose URL the policy refuses: its host, or any address its host name
/// resolves to now. A name that does not resolve (yet) is accepted, and checked at delivery.
async fn check_destination(policy: &DestinationPolicy, text: &str) -> ApiResult<()> {
    let url = match reqwest::Url::parse(text) {
        Ok(url) => url,
        Err(error) => return Err(invalid_url(format!("is not a valid URL ({error})"))),
    };
    if !matches!(url.scheme(), "http" | "https") {
        return Ok(()); // the store refuses it, naming the schemes
    }
    let refused = match policy.check_url(&url) {
        Verdict::Allowed => return Ok(()),
        Verdict::Refused(refusal) => Refused {
            name: None,
            refusal,
        },
        Verdict::Resolve => {
            let name = url.host_str().unwrap_or_default();
            let port = url.port_or_known_default().unwrap_or(80);
            let lookup = tokio::net::lookup_host((name, port));
            let Ok(Ok(addresses)) = tokio::time::timeout(CREATE_RESOLVE_TIMEOUT, lookup).await
            else {
                return Ok(());
            };
            match addresses
                .map(|address| policy.check_ip(address.ip()))
                .find_map(Result::err)
            {
                None => return Ok(()),
                Some(refusal) => Refused {
                    name: Some(name.to_owned()),
                    refusal,
                },
            }
        }
    };
    Err(invalid_url(format!(
        "{refused}; the server's operator can allow it with {ALLOW_FLAG}"
    )))
}

/// A 422 naming `url`, like the store's own validation.
fn invalid_url(message: String) -> ApiError {
    ApiError::from(starbridge_engine::Error::Invalid(vec![Problem {
        field: "url".to_owned(),
        message,
    }]))
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route(paths::WEBHOOKS, get(list).post(create))
        .route(paths::WEBHOOK, delete(remove))
        .route(paths::WEBHOOK_DELIVERIES, get(deliveries))
}

/// The subscription as shown: with its secret only to its creator, with its full URL only to
/// callers who may operate (`full_url`), since URLs often carry secrets too.
fn view(webhook: &Webhook, with_secret: bool, full_url: bool) -> api::WebhookView {
    api::WebhookView {
        id: webhook.id.clone(),
        namespace: webhook.namespace.clone(),
        url: if full_url {
            webhook.url.clone()
        } else {
            redact_url(&webhook.url)
        },
        workflow: webhook.workflow.clone(),
        states: webhook.states.iter().map(|&state| state.into()).collect(),
        created_at: api::timestamp_from_millis(webhook.created_at.0),
        secret: with_secret.then(|| webhook.secret.clone()),
    }
}

fn delivery_view(delivery: &Delivery) -> api::DeliveryView {
    let time = |ts: starbridge_core::time::Timestamp| api::timestamp_from_millis(ts.0);
    let state = match (delivery.delivered_at, delivery.next_attempt_at) {
        (Some(_), _) => DeliveryState::Delivered,
        (None, Some(_)) => DeliveryState::Pending,
        (None, None) => DeliveryState::Failed,
    };
    api::DeliveryView {
        id: delivery.id,
        job_id: delivery.job_id.clone(),
        status: delivery.status.into(),
        payload: delivery.payload.clone(),
        created_at: time(delivery.created_at),
        attempts: delivery.attempts,
        state: state.into(),
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
        .map(|status| {
            known("states", status, |text| {
                let valid: Vec<&str> = JobStatus::ALL.iter().map(|s| s.as_str()).collect();
                format!("unknown job status '{text}': use {}", valid.join(", "))
            })
        })
        .collect::<ApiResult<Vec<_>>>()?;
    check_destination(&state.webhook_policy, &request.url).await?;
    let webhook = state
        .engine
        .create_webhook(
            &namespace,
            &request.url,
            request.workflow,
            states,
            request.secret,
        )
        .await?;
    // Creating needs `operate`, which sees full URLs.
    Ok((StatusCode::CREATED, Json(view(&webhook, true, true))))
}

async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::WebhookList>> {
    let namespace = namespace(&query)?;
    let webhooks = state.engine.webhooks(&namespace).await?;
    let full_urls = caller.holds(Scope::Operate);
    Ok(Json(api::WebhookList {
        items: webhooks.iter().map(|w| view(w, false, full_urls)).collect(),
    }))
}

async fn remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<StatusCode> {
    let namespace = namespace(&query)?;
    state.engine.delete_webhook(&namespace, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct DeliveriesQuery {
    namespace: Option<String>,
    limit: Option<u32>,
}

async fn deliveries(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
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
        .engine
        .deliveries(&namespace, &id, limit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("webhook {id} not found")))?;
    let mut items: Vec<api::DeliveryView> = deliveries.iter().map(delivery_view).collect();
    if !caller.holds(Scope::Operate) {
        // Errors recorded by older versions named the URL.
        let webhooks = state.engine.webhooks(&namespace).await?;
        if let Some(webhook) = webhooks.iter().find(|webhook| webhook.id == id) {
            for item in &mut items {
                if let Some(error) = &mut item.last_error {
                    *error = without_url(error, &webhook.url);
                }
            }
        }
    }
    Ok(Json(api::DeliveryList { items }))
}

/// `text` with `url` (as given, or as a client writes it) redacted.
fn without_url(text: &str, url: &str) -> String {
    let redacted = redact_url(url);
    let mut text = text.replace(url, &redacted);
    if let Ok(parsed) = reqwest::Url::parse(url) {
        text = text.replace(parsed.as_str(), &redacted);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_in_an_older_error_is_redacted() {
        let url = "HTTPS://hooks.example/T/s3cr3t";
        let old =
            "could not deliver: error sending request for url (https://hooks.example/T/s3cr3t)";
        assert_eq!(
            without_url(old, url),
            "could not deliver: error sending request for url (https://hooks.example/…)"
        );
    }
}
