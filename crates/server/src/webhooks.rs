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

use crate::answer::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Extension, Router};
use serde::Deserialize;
use starbridge_api as api;
use starbridge_core::definition::Problem;
use starbridge_core::destination::{DestinationPolicy, Verdict, redact_url};
use starbridge_core::model::JobStatus;
use starbridge_core::webhook::WebhookEvent;
use starbridge_core::wire::DeliveryState;
use starbridge_engine::loops::deliveries::{ALLOW_FLAG, Refused};
use starbridge_engine::{Delivery, NewWebhook, Scope, Webhook};
use utoipa::IntoParams;

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{body, known, namespace};
use crate::limits::Limit;
use crate::openapi::{
    ActorHeader, BadRequest, Body, Failures, Guarded, OtherNamespace, PROBLEM, Unprocessable,
    WebhookPath, problem_answers,
};
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

/// The operations of these routes, for the OpenAPI document (`crate::openapi`).
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, create, remove, deliveries))]
pub(crate) struct Api;

problem_answers! {
    /// The subscription an operation names is not there.
    NoSuchWebhook {
        "404": "No such subscription in this namespace. With `--auth`, anything of a namespace other \
               than the one the token is bound to is not found either.",
    }
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
        events: webhook.events.iter().map(|&event| event.into()).collect(),
        steps: webhook.steps.clone(),
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

/// Subscribe a URL to job status changes and task events
///
/// From now on, every event of the subscription's `events` in the namespace is written to its
/// outbox in the same transaction as the change: a change of the status of a job (its creation
/// included) that matches `workflow` and `states` (`job.status_changed`), and a task of a job of
/// `workflow` and of one of `steps` starting, succeeding, failing for good or failing an attempt
/// that will be retried (`task.started`, `task.succeeded`, `task.failed`, `task.retrying`). Each
/// is POSTed to `url` as JSON (see the `jobStatusChanged` webhook for the body) with the headers
/// `Starbridge-Signature: t=<unix seconds>,v1=<hex>`, where `<hex>` is the HMAC-SHA256 of
/// `<t>.<body>` keyed with the secret, `Starbridge-Delivery` (the delivery id, the same across
/// retries) and `Starbridge-Event` (the body's `type`). A 2xx answer delivers it;
/// anything else is retried with backoff, up to 20 attempts. Delivery is at least once and not in
/// order. The secret is in this answer only: keep it.
#[utoipa::path(
    post,
    path = paths::WEBHOOKS,
    operation_id = "createWebhook",
    tag = "webhooks",
    params(api::NamespaceQuery, ActorHeader),
    request_body(content = api::WebhookRequest),
    responses(
        (
            status = 201,
            description = "The subscription, with its secret (shown this once).",
            body = api::openapi::CreatedWebhook,
        ),
        (
            status = 400,
            description = "The body is not a WebhookRequest object (empty, malformed JSON, an \
                           unknown field, a missing `url`, a wrong type, `states: null`; the field \
                           is `body`), an unknown job status in `states` (`states`), an unknown \
                           event in `events` (`events[i]`), or a malformed namespace or \
                           `Starbridge-Actor` header.",
            body = api::Problem, content_type = PROBLEM,
        ),
        (status = 404, response = OtherNamespace),
        (
            status = 422,
            description = "A `url` that is not a valid `http://` or `https://` URL of at most 2048 \
                           bytes (`url`), a `url` whose destination the server's policy refuses \
                           (`url`, the message starting with `destination refused by policy` and \
                           naming the server flag `--webhook-allow` that opens it; see \
                           WebhookRequest), a `secret` shorter than 16 or longer than 256 bytes \
                           (`secret`), an empty `events` (`events`) or an event named twice \
                           (`events[i]`), more than 100 `steps` or steps without a task event in \
                           `events` (`steps`), or a step that is no valid step id or is named \
                           twice (`steps[i]`). Nothing changed.",
            body = api::Problem, content_type = PROBLEM,
        ),
        Guarded, Body, Failures,
    ),
)]
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
    let events = match &request.events {
        None => None,
        Some(events) => Some(
            events
                .iter()
                .enumerate()
                .map(|(position, event)| {
                    known(&format!("events[{position}]"), event, |text| {
                        let valid: Vec<&str> =
                            WebhookEvent::ALL.iter().map(|e| e.as_str()).collect();
                        format!("unknown event '{text}': use {}", valid.join(", "))
                    })
                })
                .collect::<ApiResult<Vec<_>>>()?,
        ),
    };
    check_destination(&state.webhook_policy, &request.url).await?;
    let new = NewWebhook {
        url: request.url,
        workflow: request.workflow,
        states,
        events,
        steps: request.steps,
        secret: request.secret,
    };
    let webhook = state.engine.create_webhook(&namespace, new).await?;
    // Creating needs `operate`, which sees full URLs.
    Ok((StatusCode::CREATED, Json(view(&webhook, true, true))))
}

/// List webhook subscriptions
///
/// Every subscription of the namespace, oldest first. Secrets are not shown: only the answer to the
/// create has it. URLs, which often carry secrets too, are shown in full only to callers with the
/// `operate` scope (or to anyone without `--auth`); others see `scheme://host[:port]/…`.
#[utoipa::path(
    get,
    path = paths::WEBHOOKS,
    operation_id = "listWebhooks",
    tag = "webhooks",
    params(api::NamespaceQuery),
    responses(
        (status = 200, description = "The subscriptions.", body = api::WebhookList),
        (status = 400, response = BadRequest),
        (status = 404, response = OtherNamespace),
        (status = 422, response = Unprocessable),
        Guarded, Failures,
    ),
)]
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

/// Delete a webhook subscription
///
/// No message is written for the subscription any more, and its undelivered messages are dropped
/// (one being sent at that moment may still arrive). Its deliveries can no longer be read. Takes no
/// body (one sent is ignored).
#[utoipa::path(
    delete,
    path = paths::WEBHOOK,
    operation_id = "deleteWebhook",
    tag = "webhooks",
    params(WebhookPath, api::NamespaceQuery, ActorHeader),
    responses(
        (status = 204, description = "The subscription was deleted; the answer has no body."),
        (status = 400, response = BadRequest),
        (status = 422, response = Unprocessable),
        NoSuchWebhook, Guarded, Body, Failures,
    ),
)]
async fn remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<StatusCode> {
    let namespace = namespace(&query)?;
    state.engine.delete_webhook(&namespace, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct DeliveriesQuery {
    /// Documented by [`api::NamespaceQuery`].
    #[param(ignore)]
    namespace: Option<String>,
    /// Most deliveries to return, at least 1 (else 400) and at most the server's page limit
    /// (`--max-page-size`; the 1000 shown is its default; over it is a 422).
    #[param(minimum = 1, maximum = 1000, default = 100)]
    limit: Option<u32>,
}

/// A subscription's deliveries
///
/// The messages written for the subscription, newest first, each with how its delivery went so far.
#[utoipa::path(
    get,
    path = paths::WEBHOOK_DELIVERIES,
    operation_id = "listWebhookDeliveries",
    tag = "webhooks",
    params(WebhookPath, api::NamespaceQuery, DeliveriesQuery),
    responses(
        (status = 200, description = "The deliveries.", body = api::DeliveryList),
        (status = 400, response = BadRequest),
        (status = 422, response = Unprocessable),
        NoSuchWebhook, Guarded, Failures,
    ),
)]
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
