//! Authentication, authorization and the audit log of the HTTP API.
//!
//! With authentication on, every request but `/healthz` and the OpenAPI document carries an API
//! token (`Authorization: Bearer sbt_...`, or the `starbridge_token` cookie for browsers). The
//! route decides the scope it needs (`required_scope`); a token bound to a namespace acts only in
//! it: a request without `?namespace=` gets the token's, and one naming another namespace is
//! answered 404, exactly as if nothing were there, so existence does not leak. Handlers that
//! take the namespace from elsewhere (task polls and reports) ask the `Caller` extension.
//!
//! Every accepted change (a 2xx answer to POST, PUT, PATCH or DELETE) but the data plane (task
//! traffic and job submissions, whose history names their submitter) is appended to the audit
//! log, once the change is committed, with the token's name (or, without authentication, the
//! `Starbridge-Actor` header) and the `reason` of its body, if any; so is a workflow version an
//! inline definition makes.

use std::sync::Arc;

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use starbridge_engine::{AuditEntry, Scope, TaskScope, Token};

use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The header naming who acts when authentication is off.
pub(crate) const ACTOR_HEADER: &str = "starbridge-actor";
/// The cookie a browser may carry the token in.
const TOKEN_COOKIE: &str = "starbridge_token";

/// Who is calling: anyone (authentication off) or the holder of a token.
#[derive(Clone)]
pub(crate) enum Caller {
    Anyone,
    Token(Arc<Token>),
}

impl Caller {
    /// The namespace a request acts in: the one it names, else the token's, else the default.
    /// A namespace the token may not act in is not found.
    pub(crate) fn namespace(&self, asked: Option<&str>) -> ApiResult<String> {
        let bound = match self {
            Caller::Token(token) => token.namespace.as_deref(),
            Caller::Anyone => None,
        };
        let name = crate::extract::namespace_name(asked.or(bound))?;
        if let Caller::Token(token) = self
            && !token.may_act_in(&name)
        {
            return Err(ApiError::not_found(format!("namespace '{name}' not found")));
        }
        Ok(name)
    }

    /// Checks that this caller may serve every queue: refuses the first it may not.
    pub(crate) fn check_queues(&self, queues: &[String]) -> ApiResult<()> {
        if let Caller::Token(token) = self
            && let Some(queue) = queues.iter().find(|queue| !token.may_serve(queue))
        {
            return Err(ApiError::forbidden(format!(
                "token '{}' may not serve queue '{queue}': its queues are {}",
                token.name,
                token.queues.as_deref().unwrap_or_default().join(", ")
            )));
        }
        Ok(())
    }

    /// Whether this caller holds `scope` (anyone does when authentication is off).
    pub(crate) fn holds(&self, scope: Scope) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Token(token) => token.allows(scope),
        }
    }

    /// Whether this caller may change workflows (make versions): the `operate` scope.
    pub(crate) fn may_operate(&self) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Token(token) => token.allows(Scope::Operate),
        }
    }

    /// The tasks this caller may report on.
    pub(crate) fn task_scope(&self) -> TaskScope {
        match self {
            Caller::Anyone => TaskScope::default(),
            Caller::Token(token) => TaskScope {
                namespace: token.namespace.clone(),
                queues: token.queues.clone(),
            },
        }
    }
}

/// Who acts, as history and the audit log name them: the `Starbridge-Actor` header, which
/// `admit` sets to the token's name when the request carries a token.
pub(crate) fn actor(headers: &HeaderMap) -> ApiResult<String> {
    match headers.get(ACTOR_HEADER) {
        None => Ok("anonymous".to_owned()),
        Some(value) => value
            .to_str()
            .ok()
            .filter(|text| !text.is_empty() && text.len() <= 128)
            .map(str::to_owned)
            .ok_or_else(|| {
                ApiError::invalid(
                    "Starbridge-Actor",
                    "must be 1 to 128 visible ASCII characters",
                )
            }),
    }
}

/// The scope a route needs; `None`: it is public.
pub(crate) fn required_scope(method: &Method, path: &str) -> Option<Scope> {
    if path == "/healthz"
        || path == "/api/v1/openapi.json"
        || path == SIGN_IN_PATH
        || path.starts_with("/ui/assets/")
        || is_callback(path)
    {
        return None;
    }
    Some(
        if path == "/metrics" || path.starts_with("/api/v1/tokens") {
            Scope::Admin
        } else if path.starts_with("/api/v1/tasks/") {
            Scope::Work
        } else if path.starts_with("/api/v1/audit") {
            Scope::Operate
        } else if method == Method::GET || method == Method::HEAD {
            Scope::Read
        } else if method == Method::POST
            && (path == "/api/v1/jobs" || path == "/api/v1/jobs/batch" || is_signal(path))
        {
            Scope::Submit
        } else {
            Scope::Operate
        },
    )
}

/// A call through a callback token: its token is its credential.
fn is_callback(path: &str) -> bool {
    path.starts_with("/api/v1/callbacks/")
}

/// A signal to a job (`/api/v1/jobs/{id}/signals/{name}`): data sent in, like a submission.
fn is_signal(path: &str) -> bool {
    path.strip_prefix("/api/v1/jobs/")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(_, rest)| rest.starts_with("signals/"))
}

fn presented_token(headers: &HeaderMap) -> Option<&str> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        return value.to_str().ok()?.strip_prefix("Bearer ").map(str::trim);
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .find_map(|cookie| cookie.trim().strip_prefix(TOKEN_COOKIE)?.strip_prefix('='))
}

/// The `namespace` query parameter of a URI, if any.
fn query_namespace(uri: &Uri) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let value = pair.strip_prefix("namespace=")?;
        Some(value.to_owned())
    })
}

/// The URI with `namespace=<namespace>` added to its query.
fn with_namespace(uri: &Uri, namespace: &str) -> Result<Uri, ApiError> {
    let path = uri.path();
    let query = match uri.query() {
        Some(query) if !query.is_empty() => format!("{query}&namespace={namespace}"),
        _ => format!("namespace={namespace}"),
    };
    format!("{path}?{query}")
        .parse()
        .map_err(|_| ApiError::invalid("namespace", "cannot be placed in the request URI"))
}

/// Checks the caller's token and scope, binds the request to the token's namespace, runs the
/// request, and records accepted changes in the audit log. A browser asking for a page without
/// a token gets the sign-in form instead of a problem document.
pub(crate) async fn authorize(
    State(state): State<AppState>,
    matched: Option<MatchedPath>,
    mut request: Request,
    next: Next,
) -> Response {
    match admit(&state, &mut request).await {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            audited(&state, matched, request, next).await
        }
        Err(refusal) if refusal.status() == StatusCode::UNAUTHORIZED && wants_page(&request) => {
            sign_in_page(StatusCode::UNAUTHORIZED, "")
        }
        Err(refusal) => refusal.into_response(),
    }
}

/// Where the sign-in form posts.
pub(crate) const SIGN_IN_PATH: &str = "/ui/sign-in";

/// A browser navigating to a page (not the JSON API, not a script's request).
fn wants_page(request: &Request) -> bool {
    request.method() == Method::GET
        && !request.uri().path().starts_with("/api/")
        && request
            .headers()
            .get(header::ACCEPT)
            .and_then(|accept| accept.to_str().ok())
            .is_some_and(|accept| accept.contains("text/html"))
}

fn sign_in_page(status: StatusCode, message: &str) -> Response {
    let message = if message.is_empty() {
        String::new()
    } else {
        format!("<p role=\"alert\" class=\"refusal\">{message}</p>")
    };
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Sign in · Starbridge</title>\
         <link rel=\"stylesheet\" href=\"/ui/assets/app.css\"></head><body><main>\
         <h1>Sign in to Starbridge</h1>\
         <p>This server requires an API token (<code>starbridge token create</code>; a token \
         with the read scope shows pages, operate allows actions).</p>{message}\
         <form method=\"post\" action=\"{SIGN_IN_PATH}\">\
         <label for=\"token\">API token</label> \
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required \
         autofocus> <button type=\"submit\">Sign in</button></form></main></body></html>"
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

/// Checks a token posted by the sign-in form; a good one is kept in an HTTP-only cookie and
/// the browser goes to the jobs page.
pub(crate) async fn sign_in(State(state): State<AppState>, body: Bytes) -> Response {
    let form = String::from_utf8_lossy(&body);
    let token = form
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
        .unwrap_or_default()
        .trim();
    let valid = !token.is_empty()
        && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && matches!(state.engine.authenticate(token).await, Ok(Some(_)));
    if !valid {
        return sign_in_page(
            StatusCode::UNAUTHORIZED,
            "That token is unknown or revoked.",
        );
    }
    let cookie = format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/".to_owned()),
            (header::SET_COOKIE, cookie),
        ],
    )
        .into_response()
}

async fn admit(state: &AppState, request: &mut Request) -> ApiResult<Caller> {
    let Some(needed) = required_scope(request.method(), request.uri().path()) else {
        return Ok(Caller::Anyone);
    };
    if !state.auth.is_required() {
        return Ok(Caller::Anyone);
    }
    let presented = presented_token(request.headers()).ok_or_else(|| {
        ApiError::unauthorized(
            "this server needs an API token: send `Authorization: Bearer <token>` \
             (the CLI and SDK read STARBRIDGE_TOKEN)",
        )
    })?;
    let token = state
        .engine
        .authenticate(presented)
        .await?
        .ok_or_else(|| ApiError::unauthorized("the token is unknown or revoked"))?;
    if !token.allows(needed) {
        let held: Vec<&str> = token.scopes.iter().map(|scope| scope.as_str()).collect();
        return Err(ApiError::forbidden(format!(
            "token '{}' has scopes [{}]; this request needs {}",
            token.name,
            held.join(", "),
            needed.as_str()
        )));
    }
    if let Some(own) = &token.namespace {
        match query_namespace(request.uri()) {
            Some(asked) if &asked != own => {
                return Err(ApiError::not_found(format!(
                    "namespace '{asked}' not found"
                )));
            }
            Some(_) => {}
            None => *request.uri_mut() = with_namespace(request.uri(), own)?,
        }
    }
    // History and the audit log name the token, whatever the client says.
    let name = header::HeaderValue::from_str(&token.name)
        .map_err(|_| ApiError::invalid("token", "its name cannot be sent as a header"))?;
    request.headers_mut().insert(ACTOR_HEADER, name);
    if state.auth.due_for_touch(&token.id)
        && let Err(error) = state.engine.touch_token(&token.id).await
    {
        tracing::warn!(%error, token = %token.name, "cannot record a token's use");
    }
    Ok(Caller::Token(Arc::new(token)))
}

fn is_change(method: &Method) -> bool {
    [Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(method)
}

/// Whether a change to `path` goes to the audit log: everything but the data plane, that is
/// the worker protocol and job submissions. A submitted job's history records who submitted it
/// (in the same transaction as the job), so the log stays a record of what operators did and
/// costs the busiest calls no second write.
fn is_audited(path: &str) -> bool {
    !(path.starts_with("/api/v1/tasks/")
        || path == "/api/v1/jobs"
        || path == "/api/v1/jobs/batch"
        || is_signal(path)
        || is_callback(path))
}

async fn record(state: &AppState, entry: AuditEntry) {
    if let Err(error) = state.engine.record_audit(entry).await {
        tracing::error!(%error, "cannot write the audit log");
    }
}

/// Records the workflow version a job submission's inline definition made exactly as an apply
/// (`PUT /api/v1/workflows/{name}`) that made it would be recorded.
pub(crate) async fn audit_added_version(
    state: &AppState,
    namespace: &str,
    actor: &str,
    workflow: &str,
) {
    record(
        state,
        AuditEntry {
            seq: 0,
            at: state.engine.now(),
            namespace: namespace.to_owned(),
            actor: actor.to_owned(),
            action: "PUT /api/v1/workflows/{name}".to_owned(),
            target: format!("/api/v1/workflows/{workflow}"),
            status: StatusCode::CREATED.as_u16(),
            reason: None,
        },
    )
    .await;
}

async fn audited(
    state: &AppState,
    matched: Option<MatchedPath>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    if !is_change(request.method()) || !is_audited(&path) {
        return next.run(request).await;
    }
    let method = request.method().clone();
    let namespace = query_namespace(request.uri())
        .unwrap_or_else(|| starbridge_api::DEFAULT_NAMESPACE.to_owned());
    let actor = match actor(request.headers()) {
        Ok(actor) => actor,
        Err(refusal) => return refusal.into_response(),
    };
    let (parts, body) = request.into_parts();
    let bytes = match to_bytes(body, state.limits.body_bytes).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return state
                .limits
                .body_too_large(crate::limits::Limit::Body, "body")
                .into_response();
        }
    };
    let body = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
    let field = |name: &str| body.as_ref().and_then(|body| body.get(name));
    let reason = field("reason").and_then(|reason| reason.as_str().map(str::to_owned));
    // A bulk action's dry run only counts the jobs it would act on: it changes nothing.
    let changes = field("dry_run") != Some(&serde_json::Value::Bool(true));
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let status = response.status();
    if status.is_success() && changes {
        let route = matched.as_ref().map_or(path.as_str(), MatchedPath::as_str);
        record(
            state,
            AuditEntry {
                seq: 0,
                at: state.engine.now(),
                namespace,
                actor,
                action: format!("{method} {route}"),
                target: path,
                status: status.as_u16(),
                reason,
            },
        )
        .await;
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_need_the_scope_of_what_they_do() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(required_scope(&get, "/healthz"), None);
        assert_eq!(required_scope(&get, "/api/v1/openapi.json"), None);
        assert_eq!(required_scope(&get, "/api/v1/jobs"), Some(Scope::Read));
        assert_eq!(required_scope(&post, "/api/v1/jobs"), Some(Scope::Submit));
        assert_eq!(
            required_scope(&post, "/api/v1/jobs/x/retry"),
            Some(Scope::Operate)
        );
        assert_eq!(
            required_scope(&post, "/api/v1/tasks/poll"),
            Some(Scope::Work)
        );
        assert_eq!(required_scope(&get, "/api/v1/tokens"), Some(Scope::Admin));
        assert_eq!(
            required_scope(&post, "/api/v1/jobs/job_1/signals/paid"),
            Some(Scope::Submit)
        );
        assert_eq!(
            required_scope(&post, "/api/v1/jobs/job_1/tasks/tsk_1/approve"),
            Some(Scope::Operate)
        );
        for action in ["requeue", "fail"] {
            assert_eq!(
                required_scope(&post, &format!("/api/v1/jobs/job_1/tasks/tsk_1/{action}")),
                Some(Scope::Operate)
            );
        }
        assert_eq!(required_scope(&get, "/api/v1/approvals"), Some(Scope::Read));
        assert_eq!(
            required_scope(&Method::DELETE, "/api/v1/workflows/wf"),
            Some(Scope::Operate)
        );
        assert_eq!(
            required_scope(&post, "/api/v1/jobs/bulk/skip"),
            Some(Scope::Operate)
        );
        assert_eq!(
            required_scope(&get, "/api/v1/stats/minutes"),
            Some(Scope::Read)
        );
        assert_eq!(
            required_scope(&post, "/api/v1/callbacks/sbc_x/complete"),
            None
        );
        assert_eq!(required_scope(&get, "/metrics"), Some(Scope::Admin));
    }

    #[test]
    fn a_token_may_come_from_the_header_or_a_cookie() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "a=b; starbridge_token=sbt_x_y".parse().unwrap(),
        );
        assert_eq!(presented_token(&headers), Some("sbt_x_y"));
        headers.insert(header::AUTHORIZATION, "Bearer sbt_h_s".parse().unwrap());
        assert_eq!(presented_token(&headers), Some("sbt_h_s"));
    }

    #[test]
    fn the_namespace_is_added_to_a_query_without_one() {
        let uri: Uri = "/api/v1/jobs?limit=5".parse().unwrap();
        let bound = with_namespace(&uri, "team-a").unwrap();
        assert_eq!(bound.to_string(), "/api/v1/jobs?limit=5&namespace=team-a");
        assert_eq!(query_namespace(&bound).as_deref(), Some("team-a"));
    }
}
