//! Outbound HTTP under a destination policy (`starbridge_core::destination`): the server's
//! webhook deliveries and the worker's HTTP executor send through [`guarded_client`], which
//! checks every address a host name resolves to on every new connection (so a name that
//! rebinds to a refused address is refused then) and follows no redirect. An address written
//! in a URL does not pass through the resolver: callers check the URL's host first
//! ([`DestinationPolicy::check_url`]).

use std::net::SocketAddr;
use std::sync::Arc;

use starbridge_core::destination::{DestinationPolicy, Refusal, Verdict};

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

/// The guarded client's DNS resolver: resolves with the system's resolver and keeps only the
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
pub fn keep_allowed(
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
pub fn refused_in(error: &reqwest::Error) -> Option<&Refused> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if let Some(refused) = current.downcast_ref::<Refused>() {
            return Some(refused);
        }
        cause = current.source();
    }
    None
}

/// A client builder that connects only where `policy` allows and follows no redirect; the
/// caller adds its timeouts (and roots) and builds it.
pub fn guarded_client(policy: Arc<DestinationPolicy>) -> reqwest::ClientBuilder {
    // An error only means a provider is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        // A redirect could point anywhere (and would turn a POST into a body-less GET): the
        // caller sees the 3xx instead.
        .redirect(reqwest::redirect::Policy::none())
        // Connections go straight to the addresses the policy checked: a proxy from the
        // environment would resolve and connect on its own.
        .no_proxy()
        .dns_resolver(Arc::new(PolicyResolver(policy)))
        .user_agent(concat!("starbridge/", env!("CARGO_PKG_VERSION")))
}

/// Why a request got no answer, with its causes ("error sending request: client error
/// (Connect): tcp connect error: Connection refused (os error 111)"), without the URL, which
/// callers who may not operate must not see.
pub fn failure(error: reqwest::Error) -> String {
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
    async fn a_failed_request_keeps_its_causes_without_the_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let policy = DestinationPolicy::allowing(["127.0.0.1"]).unwrap();
        let http = guarded_client(Arc::new(policy)).build().unwrap();
        let url = format!("http://user:pass@127.0.0.1:{port}/secret-path?key=s3cr3t");
        let error = http.post(&url).send().await.unwrap_err();
        let text = failure(error);
        assert!(!text.contains("s3cr3t") && !text.contains("pass"), "{text}");
        assert!(text.contains("onnect"), "the cause is kept: {text}");
    }

    #[tokio::test]
    async fn the_resolver_refuses_a_local_name_without_connecting() {
        let http = guarded_client(Arc::default()).build().unwrap();
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
}
