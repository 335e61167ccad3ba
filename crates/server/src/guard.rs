//! Checks every request passes before it is routed, against attacks that come through a
//! browser rather than from a client of the API:
//!
//! - **Cross-origin**: a state-changing request (any method but GET, HEAD and OPTIONS) is
//!   refused when `Sec-Fetch-Site` says another site or origin sent it, or when its `Origin`
//!   (`null` included) is not the host it was sent to. Clients that send neither header (the
//!   CLI, the SDKs, curl) pass. Every other port of `localhost` counts as another origin.
//! - **Host**: without authentication, a request naming a host other than `localhost`, an IP
//!   address or a name given with `--allowed-host` is refused, so a DNS name rebound to the
//!   loopback address cannot read or drive a local server.
//! - **Content type**: a request with a body names its type, and it must be one the route
//!   reads (JSON; YAML too for a workflow definition; the sign-in form's encoding), so a page
//!   cannot send JSON as `text/plain`, which browsers send cross-site without asking.
//! - **Header section**: at most `MAX_HEADER_FIELDS` fields and `MAX_HEADER_BYTES` bytes.
//! - **Target**: no NUL character (`%00`) in the path or query.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::auth::SIGN_IN_PATH;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Most header fields a request may carry.
pub(crate) const MAX_HEADER_FIELDS: usize = 100;
/// Largest header section a request may carry (names and values).
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;

const JSON: &[&str] = &["application/json", "application/*+json"];
const DEFINITION: &[&str] = &[
    "application/json",
    "application/*+json",
    "application/yaml",
    "application/x-yaml",
    "text/yaml",
];
const FORM: &[&str] = &["application/x-www-form-urlencoded"];

/// Refuses a request that fails one of the checks; passes the rest on.
pub(crate) async fn check(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match admissible(&state, &request) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

fn admissible(state: &AppState, request: &Request) -> ApiResult<()> {
    let headers = request.headers();
    header_section(headers)?;
    no_nul_in_target(request.uri())?;
    let host = request_host(request);
    if !state.auth.is_required() {
        allowed_host(host, &state.allowed_hosts)?;
    }
    if !is_safe(request.method()) {
        same_origin(headers, host)?;
    }
    content_type(request.method(), request.uri().path(), headers)
}

fn header_section(headers: &HeaderMap) -> ApiResult<()> {
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers.len() > MAX_HEADER_FIELDS || bytes > MAX_HEADER_BYTES {
        return Err(ApiError::refused(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            "Request headers too large",
            format!(
                "the request carries {} header fields in {bytes} bytes; at most \
                 {MAX_HEADER_FIELDS} fields and {MAX_HEADER_BYTES} bytes are read",
                headers.len()
            ),
        ));
    }
    Ok(())
}

/// The `Host` a request was sent to (or the authority of an absolute request target).
fn request_host(request: &Request) -> Option<&str> {
    match request.headers().get(header::HOST) {
        Some(value) => value.to_str().ok(),
        None => request
            .uri()
            .authority()
            .map(|authority| authority.as_str()),
    }
}

/// Refuses a NUL character (`%00`) in the path or query: names and filters there are text the
/// database cannot take with one.
fn no_nul_in_target(uri: &axum::http::Uri) -> ApiResult<()> {
    for (part, text) in [("path", Some(uri.path())), ("query", uri.query())] {
        if text.is_some_and(|text| text.contains("%00")) {
            return Err(ApiError::validation(
                part,
                "must not contain a NUL character (%00): remove it",
            ));
        }
    }
    Ok(())
}

fn is_safe(method: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::OPTIONS].contains(method)
}

/// The host name of a `host[:port]` authority, without brackets around an IPv6 address.
fn host_name(authority: &str) -> &str {
    if let Some(bracketed) = authority.strip_prefix('[') {
        return bracketed.split(']').next().unwrap_or_default();
    }
    match authority.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => authority,
    }
}

/// Whether a server without authentication answers to this host: an IP address, `localhost`,
/// or a name the operator listed. A request without a host (HTTP/1.0) names no DNS name.
fn allowed_host(host: Option<&str>, allowed: &[String]) -> ApiResult<()> {
    let Some(host) = host else {
        return Ok(());
    };
    let name = host_name(host);
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|listed| {
            let listed = listed.strip_suffix('.').unwrap_or(listed);
            listed.eq_ignore_ascii_case(name)
        })
    {
        return Ok(());
    }
    Err(ApiError::refused(
        StatusCode::FORBIDDEN,
        "host-not-allowed",
        "Host not allowed",
        format!(
            "this server runs without authentication and answers only to localhost, IP \
             addresses and the names given with --allowed-host (STARBRIDGE_ALLOWED_HOSTS); \
             '{name}' is not one of them: start it with --allowed-host {name}, or with --auth"
        ),
    ))
}

fn cross_origin(detail: String) -> ApiError {
    ApiError::refused(
        StatusCode::FORBIDDEN,
        "cross-origin",
        "Cross-origin request refused",
        detail,
    )
}

fn same_origin(headers: &HeaderMap, host: Option<&str>) -> ApiResult<()> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or_default();
        if site != "same-origin" && site != "none" {
            return Err(cross_origin(format!(
                "the browser says another site sent this request (Sec-Fetch-Site: {site}); \
                 changes are taken only from this server's own pages and from clients that are \
                 not browsers"
            )));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or_default();
        let authority = origin.split_once("://").map(|(_, authority)| authority);
        let matches = match (authority, host) {
            (Some(authority), Some(host)) => authority.eq_ignore_ascii_case(host),
            _ => false,
        };
        if !matches {
            return Err(cross_origin(format!(
                "the request comes from the page of origin '{origin}', not from this server \
                 ({}); changes are taken only from this server's own pages and from clients \
                 that are not browsers",
                host.unwrap_or("no Host header")
            )));
        }
    }
    Ok(())
}

fn has_body(headers: &HeaderMap) -> bool {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return true;
    }
    headers
        .get(header::CONTENT_LENGTH)
        .is_some_and(|length| length.to_str().map_or(true, |length| length.trim() != "0"))
}

/// The media types a route reads its body as.
fn accepted_types(method: &Method, path: &str) -> &'static [&'static str] {
    if path == SIGN_IN_PATH {
        FORM
    } else if method == Method::PUT && path.starts_with("/api/v1/workflows/") {
        DEFINITION
    } else {
        JSON
    }
}

fn accepts(accepted: &[&str], media_type: &str) -> bool {
    accepted
        .iter()
        .any(|pattern| match pattern.split_once("*") {
            Some((prefix, suffix)) => {
                media_type.len() > prefix.len() + suffix.len()
                    && media_type.starts_with(prefix)
                    && media_type.ends_with(suffix)
            }
            None => media_type == *pattern,
        })
}

fn content_type(method: &Method, path: &str, headers: &HeaderMap) -> ApiResult<()> {
    if !has_body(headers) {
        return Ok(());
    }
    let accepted = accepted_types(method, path);
    let declared = headers
        .get(header::CONTENT_TYPE)
        .map(|value| value.to_str().unwrap_or_default());
    let media_type = declared
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    if accepts(accepted, &media_type) {
        return Ok(());
    }
    let got = match declared {
        Some(value) => format!("got '{value}'"),
        None => "the request names none".to_owned(),
    };
    let message = format!(
        "the body must be sent as {} ({got}); with curl, add -H 'Content-Type: {}'",
        accepted.join(", "),
        accepted[0]
    );
    Err(ApiError::refused(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
        "Unsupported media type",
        message,
    )
    .with_field("Content-Type"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn a_change_from_another_site_or_origin_is_refused() {
        let host = Some("127.0.0.1:7433");
        for refused in [
            headers(&[("sec-fetch-site", "cross-site")]),
            headers(&[("sec-fetch-site", "same-site")]),
            headers(&[("origin", "null")]),
            headers(&[("origin", "https://evil.example")]),
            headers(&[("origin", "http://127.0.0.1:8080")]),
            headers(&[
                ("sec-fetch-site", "same-origin"),
                ("origin", "http://localhost:7433"),
            ]),
        ] {
            let refusal = same_origin(&refused, host).unwrap_err();
            assert_eq!(refusal.status(), StatusCode::FORBIDDEN, "{refused:?}");
        }
        for passed in [
            headers(&[]),
            headers(&[("sec-fetch-site", "none")]),
            headers(&[
                ("sec-fetch-site", "same-origin"),
                ("origin", "http://127.0.0.1:7433"),
            ]),
        ] {
            assert!(same_origin(&passed, host).is_ok(), "{passed:?}");
        }
    }

    #[test]
    fn only_localhost_addresses_and_listed_names_are_served_without_auth() {
        let listed = vec!["starbridge.internal".to_owned()];
        for host in [
            "localhost:7433",
            "LOCALHOST",
            "localhost.",
            "127.0.0.1:7433",
            "[::1]:7433",
            "10.0.0.5",
            "starbridge.internal:7433",
        ] {
            assert!(allowed_host(Some(host), &listed).is_ok(), "{host}");
        }
        for host in [
            "evil.example",
            "rebind.evil.example:7433",
            "localhost.evil.example",
        ] {
            let refusal = allowed_host(Some(host), &listed).unwrap_err();
            assert_eq!(refusal.status(), StatusCode::FORBIDDEN);
            assert!(refusal.detail().contains("--allowed-host"), "{host}");
        }
        assert!(allowed_host(None, &listed).is_ok());
    }

    #[test]
    fn a_body_must_name_a_type_its_route_reads() {
        let post = Method::POST;
        let json = headers(&[
            ("content-length", "2"),
            ("content-type", "application/json; charset=utf-8"),
        ]);
        assert!(content_type(&post, "/api/v1/jobs", &json).is_ok());
        let problem_json = headers(&[
            ("content-length", "2"),
            ("content-type", "application/merge-patch+json"),
        ]);
        assert!(content_type(&post, "/api/v1/jobs", &problem_json).is_ok());
        let plain = headers(&[("content-length", "2"), ("content-type", "text/plain")]);
        let refusal = content_type(&post, "/api/v1/jobs", &plain).unwrap_err();
        assert_eq!(refusal.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(refusal.detail().contains("application/json"));
        let untyped = headers(&[("transfer-encoding", "chunked")]);
        assert!(content_type(&post, "/api/v1/jobs", &untyped).is_err());
        let yaml = headers(&[("content-length", "9"), ("content-type", "text/yaml")]);
        assert!(content_type(&Method::PUT, "/api/v1/workflows/w", &yaml).is_ok());
        assert!(content_type(&post, "/api/v1/jobs", &yaml).is_err());
        let form = headers(&[
            ("content-length", "9"),
            ("content-type", "application/x-www-form-urlencoded"),
        ]);
        assert!(content_type(&post, SIGN_IN_PATH, &form).is_ok());
        let empty = headers(&[("content-length", "0")]);
        assert!(content_type(&post, "/api/v1/jobs/x/pause", &empty).is_ok());
        assert!(content_type(&post, "/api/v1/jobs/x/pause", &headers(&[])).is_ok());
    }

    #[test]
    fn an_oversized_header_section_is_refused() {
        let mut many = HeaderMap::new();
        for n in 0..=MAX_HEADER_FIELDS {
            many.append(
                axum::http::HeaderName::try_from(format!("x-h{n}")).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        let refusal = header_section(&many).unwrap_err();
        assert_eq!(
            refusal.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        assert!(header_section(&headers(&[("x", "y")])).is_ok());
    }
}
