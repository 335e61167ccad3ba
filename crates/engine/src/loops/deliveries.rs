//! The webhook deliverer: sends the outbox's due deliveries (written by the commands in the
//! same transaction as the job changes they report), signed with HMAC-SHA256, where the
//! destination policy allows (`starbridge_core::destination`): the URL's host is checked before
//! sending, every address a host name resolves to on every new connection, and no redirect is
//! followed. Each attempt is recorded; the outbox decides when the next one is due.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use starbridge_core::destination::{DestinationPolicy, Refusal, Verdict, redact_url};
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
/// A destination the policy refuses: the refused host or address, and the name asked for when
/// it is one of that name's addresses.
#[derive(Debug)]
pub struct Refused {
    pub name: Option<String>,
    pub refusal: Refusal,
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
pub(crate) fn keep_allowed(
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
    // An error only means a provider is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
