//! The Starbridge server: the HTTP API, long-poll dispatch to workers, and the timer loop that
//! expires leases and enforces deadlines. All state lives in the store. Serves plain HTTP, or
//! HTTPS when given a certificate.

mod auth;
mod batch;
mod error;
pub mod limits;
mod metrics;
mod openapi;
mod operate;
pub mod process;
mod queues;
mod routes;
mod schedules;
mod timers;
pub mod tls;
mod tokens;
mod ui;
mod views;
mod webhooks;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use starbridge_store::Store;
use tokio::net::TcpListener;

pub use auth::Auth;
pub use error::ApiError;
pub use limits::{Limit, Limits};
pub use routes::{AppState, router};
pub use timers::{run_pruner, run_timers};

/// The whole HTTP surface: the JSON API (`router`) and the web UI, both behind the same
/// authentication. `closing` turns true when the server begins to shut down, which ends the
/// UI's open event streams.
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
    router(state).merge(ui).merge(sign_in)
}
pub use webhooks::{run_deliveries, signature};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] starbridge_store::Error),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    #[error("server failed: {0}")]
    Serve(std::io::Error),
}

/// A bound server, not yet serving: lets the caller learn the address (port 0) first.
pub struct Server {
    store: Store,
    listener: TcpListener,
    auth: bool,
    limits: Limits,
    tls: Option<Arc<rustls::ServerConfig>>,
}

impl Server {
    pub async fn bind(store: Store, address: &str) -> Result<Server, Error> {
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
            tls: None,
        })
    }

    /// Requires an API token on every request but health and the API document.
    pub fn with_auth(mut self) -> Server {
        self.auth = true;
        self
    }

    /// Serves with these limits instead of the defaults. The engine's run limits
    /// (`limits.run`) are the store's: open it with the same ones (`Store::open_with`).
    pub fn with_limits(mut self, limits: Limits) -> Server {
        self.limits = limits;
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
        let deliveries = tokio::spawn(run_deliveries(self.store.clone(), timers_stopped));
        let mut state = AppState::with_limits(self.store, self.limits);
        if self.auth {
            state.auth = Arc::new(Auth::required());
        }
        let (closing, closing_seen) = tokio::sync::watch::channel(false);
        let app = app(state, closing_seen);
        let shutdown = async move {
            shutdown.await;
            let _ = closing.send(true);
        };
        let served = match self.tls {
            None => axum::serve(self.listener, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(Error::Serve),
            Some(config) => match tls::TlsListener::new(self.listener, config) {
                Ok(listener) => axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await
                    .map_err(Error::Serve),
                Err(error) => Err(Error::Serve(error)),
            },
        };
        let _ = stop_timers.send(true);
        let _ = timers.await;
        let _ = deliveries.await;
        let _ = pruner.await;
        served
    }
}
