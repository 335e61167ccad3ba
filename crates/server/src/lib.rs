//! The Starbridge server: the HTTP API, long-poll dispatch to workers, and the timer loop that
//! expires leases and enforces deadlines. All state lives in the store.

mod auth;
mod batch;
mod error;
mod metrics;
mod openapi;
mod operate;
mod queues;
mod routes;
mod schedules;
mod timers;
mod tokens;
mod ui;
mod views;
mod webhooks;

use std::future::Future;
use std::net::SocketAddr;

use starbridge_store::Store;
use tokio::net::TcpListener;

pub use auth::Auth;
pub use error::ApiError;
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
    let sign_in = axum::Router::new()
        .route(auth::SIGN_IN_PATH, axum::routing::post(auth::sign_in))
        .with_state(state.clone());
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
        })
    }

    /// Requires an API token on every request but health and the API document.
    pub fn with_auth(mut self) -> Server {
        self.auth = true;
        self
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
        let state = if self.auth {
            AppState::with_auth(self.store)
        } else {
            AppState::new(self.store)
        };
        let (closing, closing_seen) = tokio::sync::watch::channel(false);
        let app = app(state, closing_seen);
        let shutdown = async move {
            shutdown.await;
            let _ = closing.send(true);
        };
        let served = axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(Error::Serve);
        let _ = stop_timers.send(true);
        let _ = timers.await;
        let _ = deliveries.await;
        let _ = pruner.await;
        served
    }
}
