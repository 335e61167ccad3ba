//! The in-process harness the server's test files share: the whole HTTP surface as the server
//! serves it (`starbridge_server::app`: the request checks, the API and the web UI) over a fresh
//! SQLite file (or a scratch PostgreSQL schema, `Api::on_postgres`), driven without a socket. Each test file uses only some of it.
#![allow(dead_code)]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode, header};
use serde_json::Value;
use starbridge_engine::{Clock, Engine, NewToken, Scope, StoreOptions, SystemClock};
use starbridge_server::{AppState, Auth, Limits, app};
use tokio::sync::watch;
use tower::ServiceExt;

/// A served app and the engine behind it.
pub(crate) struct Api {
    pub(crate) app: Router,
    pub(crate) engine: Engine,
    /// Set to true as the server does when it shuts down (ends the UI's event streams).
    pub(crate) closing: watch::Sender<bool>,
    /// Where the database lives (a directory or a schema), dropped after the engine.
    _place: Box<dyn std::any::Any + Send + Sync>,
}

/// An answer: status, content type, headers and body text.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) content_type: String,
    pub(crate) headers: HeaderMap,
    pub(crate) text: String,
}

impl Answer {
    /// The body as JSON (`null` when it is not JSON).
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }

    pub(crate) fn header(&self, name: header::HeaderName) -> Option<String> {
        self.headers
            .get(name)
            .map(|value| value.to_str().unwrap().to_owned())
    }
}

impl Api {
    /// No authentication, the default limits, the system clock.
    pub(crate) fn start() -> Api {
        Api::open(Arc::new(SystemClock), Limits::default(), false)
    }

    /// Every request but health and the API document needs a token (see `token`).
    pub(crate) fn with_auth() -> Api {
        Api::open(Arc::new(SystemClock), Limits::default(), true)
    }

    pub(crate) fn with_clock(clock: Arc<dyn Clock>) -> Api {
        Api::open(clock, Limits::default(), false)
    }

    pub(crate) fn with_limits(limits: Limits) -> Api {
        Api::open(Arc::new(SystemClock), limits, false)
    }

    /// No authentication and the default limits over a PostgreSQL schema of its own; `None`
    /// when no PostgreSQL server is reachable (and none is required).
    pub(crate) fn on_postgres(label: &str) -> Option<Api> {
        let schema = starbridge_store::scratch::ScratchSchema::create(label)?;
        let url = schema.url.clone();
        let limits = Limits::default();
        Some(Api::at(
            url,
            Box::new(schema),
            Arc::new(SystemClock),
            limits,
            false,
        ))
    }

    fn open(clock: Arc<dyn Clock>, limits: Limits, auth: bool) -> Api {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("server.db").display());
        Api::at(url, Box::new(dir), clock, limits, auth)
    }

    fn at(
        url: String,
        place: Box<dyn std::any::Any + Send + Sync>,
        clock: Arc<dyn Clock>,
        limits: Limits,
        auth: bool,
    ) -> Api {
        let options = StoreOptions {
            limits: limits.run,
            ..StoreOptions::default()
        };
        let engine = Engine::open_with(&url, options, clock).unwrap();
        let mut state = AppState::with_limits(engine.clone(), limits);
        if auth {
            state.auth = Arc::new(Auth::required());
        }
        let (closing, closing_seen) = watch::channel(false);
        Api {
            app: app(state, closing_seen),
            engine,
            closing,
            _place: place,
        }
    }

    /// Sends one request with these headers and body.
    pub(crate) async fn send(
        &self,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Answer {
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Body::from(body.to_owned())).unwrap();
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        Answer {
            status,
            content_type,
            headers,
            text: String::from_utf8(bytes.to_vec()).unwrap(),
        }
    }

    /// Sends a JSON body (or a definition, which the server reads as YAML or JSON alike).
    pub(crate) async fn send_json(&self, method: &str, uri: &str, body: &str) -> Answer {
        self.send(method, uri, &[("content-type", "application/json")], body)
            .await
    }

    /// Makes a token straight in the store; answers its secret.
    pub(crate) async fn token(
        &self,
        name: &str,
        namespace: Option<&str>,
        scopes: &[Scope],
        queues: Option<&[&str]>,
    ) -> String {
        let new = NewToken {
            name: name.to_owned(),
            namespace: namespace.map(str::to_owned),
            scopes: scopes.to_vec(),
            queues: queues.map(|queues| queues.iter().map(|q| (*q).to_owned()).collect()),
            created_by: "test".to_owned(),
        };
        self.engine.create_token(new).await.unwrap().1
    }
}
