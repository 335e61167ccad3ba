//! Webhooks: the subscription endpoints and the deliverer, which sends the store's outbox.
//!
//! Each message is `POST`ed as JSON with `Starbridge-Signature: t=<unix seconds>,v1=<hex>`, where
//! `<hex>` is HMAC-SHA256 with the subscription's secret over `"<t>.<body>"`; receivers recompute
//! it and may reject old `t` values to resist replays. `Starbridge-Delivery` carries the delivery
//! id, stable across retries, so receivers can drop duplicates (delivery is at least once).
//!
//! Where deliveries may go is the server's destination policy (`--webhook-allow`; see
//! [`starbridge_core::destination`]). The create refuses a destination the policy refuses,
//! resolving a host name to check its addresses; the deliverer checks again before every
//! connection, after DNS resolution (its resolver drops refused addresses), since a name may
//! resolve elsewhere by then and a subscription may predate the policy. It follows no redirect
//! and uses no proxy, so the addresses it checks are the ones it connects to. Whoever may not
//! operate sees subscription URLs without their user information, path and query.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Extension, Json, Router};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use starbridge_api as api;
use starbridge_core::definition::Problem;
use starbridge_core::destination::{DestinationPolicy, Refusal, Verdict, redact_url};
use starbridge_core::model::JobStatus;
use starbridge_store::{Attempt, Delivery, DueDelivery, Scope, Store, Webhook};
use tokio::sync::watch;

use crate::auth::Caller;
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
/// The server flag that opens destinations the policy refuses by default.
const ALLOW_FLAG: &str = "--webhook-allow";
/// How long the create waits for a host name to resolve before leaving the check to delivery.
const CREATE_RESOLVE_TIMEOUT: StdDuration = StdDuration::from_secs(5);

/// A destination the policy refuses: the refused host or address, and the name asked for when
/// it is one of that name's addresses.
#[derive(Debug)]
struct Refused {
    name: Option<String>,
    refusal: Refusal,
}

/// "destination refused by policy: 127.0.0.1 is a loopback address", or "…: hooks.example
/// resolves to 10.0.0.5, a private address".
impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            None => write!(f, "destination refused by policy: {}", self.refusal),
            Some(name) => write!(
                f,
                "destination refused by policy: {name} resolves to {}, {}",
                self.refusal.destination,
                self.refusal.what()
            ),
        }
    }
}

impl std::error::Error for Refused {}

/// The deliverer's DNS resolver: resolves with the system's resolver and keeps only the
/// addresses the policy allows (all of them for a host name the policy opens); refuses the
/// name when none is left. reqwest asks it for every new connection to a host name (addresses
/// written in the URL do not come here: `send` checks those).
struct PolicyResolver(Arc<DestinationPolicy>);

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let check = policy.check_name(&name);
            if let Verdict::Refused(refusal) = check {
                return Err(Box::new(Refused {
                    name: None,
                    refusal,
                }) as _);
            }
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let kept = if check == Verdict::Allowed {
                resolved
            } else {
                keep_allowed(&policy, &name, resolved)?
            };
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The addresses `name` resolved to that the policy allows; refuses the name if it allows none.
fn keep_allowed(
    policy: &DestinationPolicy,
    name: &str,
    resolved: Vec<SocketAddr>,
) -> Result<Vec<SocketAddr>, Refused> {
    let mut refused = None;
    let allowed: Vec<SocketAddr> = resolved
        .into_iter()
        .filter(|address| match policy.check_ip(address.ip()) {
            Ok(()) => true,
            Err(refusal) => {
                refused.get_or_insert(refusal);
                false
            }
        })
        .collect();
    match refused {
        Some(refusal) if allowed.is_empty() => Err(Refused {
            name: Some(name.to_owned()),
            refusal,
        }),
        _ => Ok(allowed),
    }
}

/// The policy's refusal behind a failed request, if that is why it failed.
fn refused_in(error: &reqwest::Error) -> Option<&Refused> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if let Some(refused) = current.downcast_ref::<Refused>() {
            return Some(refused);
        }
        cause = current.source();
    }
    None
}

/// The deliverer's HTTP client: connects only where `policy` allows, follows no redirect.
fn delivery_client(policy: Arc<DestinationPolicy>) -> reqwest::Result<reqwest::Client> {
    crate::tls::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        // A redirect would turn the POST into a body-less GET, and could point anywhere: report
        // it as a failure instead.
        .redirect(reqwest::redirect::Policy::none())
        // Connections go straight to the addresses the policy checked: a proxy from the
        // environment would resolve and connect on its own.
        .no_proxy()
        .dns_resolver(Arc::new(PolicyResolver(policy)))
        .user_agent(concat!("starbridge/", env!("CARGO_PKG_VERSION")))
        .build()
}

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
    ApiError::from(starbridge_store::Error::Invalid(vec![Problem {
        field: "url".to_owned(),
        message,
    }]))
}

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
    check_destination(&state.webhook_policy, &request.url).await?;
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
    // Creating needs `operate`, which sees full URLs.
    Ok((StatusCode::CREATED, Json(view(&webhook, true, true))))
}

async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Query(query): Query<api::NamespaceQuery>,
) -> ApiResult<Json<api::WebhookList>> {
    let namespace = namespace(&query)?;
    let webhooks = state.store.webhooks(&namespace).await?;
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
        .store
        .deliveries(&namespace, &id, limit)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("webhook {id} not found")))?;
    let mut items: Vec<api::DeliveryView> = deliveries.iter().map(delivery_view).collect();
    if !caller.holds(Scope::Operate) {
        // Errors recorded by older versions named the URL.
        let webhooks = state.store.webhooks(&namespace).await?;
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

/// Why a request got no answer, with its causes ("error sending request: client error
/// (Connect): tcp connect error: Connection refused (os error 111)"), without the URL, which
/// callers who may not operate must not see.
fn failure(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(current) = cause {
        text.push_str(": ");
        text.push_str(&current.to_string());
        cause = current.source();
    }
    text
}

/// Sends one delivery and says how it went. A destination the policy refuses is not connected
/// to: its host here, or every address its name resolves to (in `PolicyResolver`).
async fn send(
    http: &reqwest::Client,
    policy: &DestinationPolicy,
    store: &Store,
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
        .header("starbridge-event", "job.status_changed")
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

/// The error recorded for a refused delivery.
fn refused_error(refused: &Refused) -> String {
    format!("{refused} (not sent; {ALLOW_FLAG} opens it)")
}

/// Sends due deliveries until `stop`, where `policy` allows; sleeps until the next retry or a
/// new delivery.
pub async fn run_deliveries(
    store: Store,
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
    fn a_name_is_refused_only_when_every_address_it_resolves_to_is() {
        let policy = DestinationPolicy::default();
        let address = |text: &str| -> SocketAddr { text.parse().unwrap() };
        let refused = keep_allowed(
            &policy,
            "hooks.example",
            vec![address("10.0.0.5:0"), address("[::1]:0")],
        )
        .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "destination refused by policy: hooks.example resolves to 10.0.0.5, a private address"
        );
        let kept = keep_allowed(
            &policy,
            "hooks.example",
            vec![address("169.254.169.254:0"), address("192.0.2.7:0")],
        )
        .unwrap();
        assert_eq!(
            kept,
            [address("192.0.2.7:0")],
            "refused addresses are dropped"
        );
    }

    #[tokio::test]
    async fn a_failed_delivery_records_its_causes_without_the_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let policy = DestinationPolicy::allowing(["127.0.0.1"]).unwrap();
        let http = delivery_client(Arc::new(policy)).unwrap();
        let url = format!("http://user:pass@127.0.0.1:{port}/secret-path?key=s3cr3t");
        let error = http.post(&url).send().await.unwrap_err();
        let text = failure(error);
        assert!(!text.contains("s3cr3t") && !text.contains("pass"), "{text}");
        assert!(text.contains("onnect"), "the cause is kept: {text}");
    }

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

    #[tokio::test]
    async fn the_delivery_client_refuses_a_local_name_in_its_resolver_without_connecting() {
        let http = delivery_client(Arc::default()).unwrap();
        let error = http
            .post("http://localhost:9/hook")
            .send()
            .await
            .unwrap_err();
        let refused = refused_in(&error).expect("the policy's refusal is the cause");
        assert_eq!(
            refused.to_string(),
            "destination refused by policy: localhost is a name of this host"
        );
    }

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
