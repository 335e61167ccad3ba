//! The Starbridge server: HTTP and the web UI over the engine (`starbridge-engine`), which holds
//! every rule, the long poll and the background loops (`Server::run` starts them). Serves plain
//! HTTP, or HTTPS when given a certificate.

mod answer;
mod approvals;
mod auth;
mod batch;
mod callbacks;
mod error;
mod extract;
mod guard;
mod health;
mod jobs;
mod json_checks;
pub mod limits;
mod metrics;
mod minutes;
mod openapi;
mod operate;
pub mod process;
mod queues;
mod rejections;
mod routes;
mod schedules;
pub mod serve;
mod signals;
mod state;
mod tasks;
pub mod tls;
mod tokens;
mod traces;
mod ui;
mod views;
mod webhooks;
mod workflows;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use starbridge_core::destination::DestinationPolicy;
use tokio::net::TcpListener;

pub use error::ApiError;
pub use limits::{Limit, Limits};
pub use routes::router;
pub use serve::ConnectionLimits;
pub use starbridge_engine::{run_deliveries, run_pruner, run_rollup, run_timers, signature};
pub use state::AppState;
pub use state::Auth;

// What opening the engine a `Server` serves takes, for a program that embeds one without
// depending on the engine (`starbridge bench`); with `scratch`, a PostgreSQL schema of its own,
// and whether a PostgreSQL URL names a server on this machine (whose CPU the benchmark reads).
pub use starbridge_engine::{Durability, Engine, StoreOptions, SystemClock, sqlite_path};
#[cfg(feature = "scratch")]
pub use starbridge_store::postgres::{
    is_on_this_machine as postgres_is_on_this_machine, is_postgres_url,
};
#[cfg(feature = "scratch")]
pub use starbridge_store::scratch;

/// The whole HTTP surface: the JSON API (`router`) and the web UI, both behind the same
/// authentication. `closing` turns true when the server begins to shut down, which ends the
/// UI's open event streams. Every request first passes the checks of `guard` (cross-origin,
/// `Host`, content type, header size).
pub fn app(state: AppState, closing: tokio::sync::watch::Receiver<bool>) -> axum::Router {
    let ui = ui::router(state.clone(), closing).route_layer(axum::middleware::from_fn_with_state(
        state.clone(),
        auth::authorize,
    ));
    // The sign-in form's target is public: it is how a browser gets its token cookie.
    // (A service route: the OpenAPI route scan, which looks at API routes, passes it by.)
    let sign_in = axum::Router::new().route_service(
        auth::SIGN_IN_PATH,
        axum::routing::post(auth::sign_in).with_state(state.clone()),
    );
    router(state.clone())
        .merge(ui)
        .merge(sign_in)
        .layer(axum::middleware::from_fn_with_state(state, guard::check))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] starbridge_engine::Error),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
}

/// A bound server, not yet serving: lets the caller learn the address (port 0) first.
pub struct Server {
    store: Engine,
    listener: TcpListener,
    auth: bool,
    limits: Limits,
    webhook_policy: Arc<DestinationPolicy>,
    connections: ConnectionLimits,
    allowed_hosts: Vec<String>,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl Server {
    pub async fn bind(store: Engine, address: &str) -> Result<Server, Error> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| Error::Listen {
                address: address.to_owned(),
                source,
            })?;
        Ok(Server {
            store,
            listener,
            auth: false,
            limits: Limits::default(),
            webhook_policy: Arc::default(),
            connections: ConnectionLimits::default(),
            allowed_hosts: Vec::new(),
            tls: None,
        })
    }

    /// Requires an API token on every request but health and the API document.
    pub fn with_auth(mut self) -> Server {
        self.auth = true;
        self
    }

    /// Serves with these limits instead of the defaults. The engine's run limits
    /// (`limits.run`) are the store's: open it with the same ones (`Engine::open_with`).
    pub fn with_limits(mut self, limits: Limits) -> Server {
        self.limits = limits;
        self
    }

    /// Bounds connections: header read and idle timeouts, most open at once.
    pub fn with_connection_limits(mut self, connections: ConnectionLimits) -> Server {
        self.connections = connections;
        self
    }

    /// Host names, besides `localhost` and IP addresses, that requests may be addressed to when
    /// authentication is off (with it on, any).
    pub fn with_allowed_hosts(mut self, hosts: Vec<String>) -> Server {
        self.allowed_hosts = hosts;
        self
    }

    /// Lets webhooks reach what this policy allows (by default, no local or private
    /// destination: see [`starbridge_core::destination`]).
    pub fn with_webhook_policy(mut self, policy: DestinationPolicy) -> Server {
        self.webhook_policy = Arc::new(policy);
        self
    }

    /// Serves HTTPS with this configuration (see [`tls::server_config`]).
    pub fn with_tls(mut self, config: Arc<rustls::ServerConfig>) -> Server {
        self.tls = Some(config);
        self
    }

    /// The URL clients reach the server at: `http://` or `https://` and the bound address.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr())
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves the API and runs the timers until `shutdown` resolves.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let (stop_timers, timers_stopped) = tokio::sync::watch::channel(false);
        let timers = tokio::spawn(run_timers(self.store.clone(), timers_stopped.clone()));
        let pruner = tokio::spawn(run_pruner(self.store.clone(), timers_stopped.clone()));
        let rollup = tokio::spawn(run_rollup(self.store.clone(), timers_stopped.clone()));
        let deliveries = tokio::spawn(run_deliveries(
            self.store.clone(),
            self.webhook_policy.clone(),
            timers_stopped,
        ));
        let mut state = AppState::with_limits(self.store, self.limits);
        if self.auth {
            state.auth = Arc::new(Auth::required());
        }
        state.webhook_policy = self.webhook_policy;
        state.allowed_hosts = self.allowed_hosts.into();
        let (closing, closing_seen) = tokio::sync::watch::channel(false);
        let app = app(state, closing_seen);
        let shutdown = async move {
            shutdown.await;
            let _ = closing.send(true);
        };
        serve::serve(self.listener, self.tls, app, self.connections, shutdown).await;
        let _ = stop_timers.send(true);
        let _ = timers.await;
        let _ = deliveries.await;
        let _ = pruner.await;
        let _ = rollup.await;
        Ok(())
    }
}
