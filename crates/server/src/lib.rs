//! The Starbridge server: the HTTP API, long-poll dispatch to workers, and the timer loop that
//! expires leases and enforces deadlines. All state lives in the store.

mod error;
mod metrics;
mod openapi;
mod operate;
mod queues;
mod routes;
mod schedules;
mod timers;
mod ui;
mod views;
mod webhooks;

use std::future::Future;
use std::net::SocketAddr;

use starbridge_store::Store;
use tokio::net::TcpListener;

pub use error::ApiError;
pub use routes::{AppState, router};

/// The whole HTTP surface: the JSON API (`router`) and the web UI. `closing` turns true when
/// the server begins to shut down, which ends the UI's open event streams.
pub fn app(state: AppState, closing: tokio::sync::watch::Receiver<bool>) -> axum::Router {
    router(state.clone()).merge(ui::router(state, closing))
}
pub use timers::run_timers;
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
}

impl Server {
    pub async fn bind(store: Store, address: &str) -> Result<Server, Error> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| Error::Listen {
                address: address.to_owned(),
                source,
            })?;
        Ok(Server { store, listener })
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
        let deliveries = tokio::spawn(run_deliveries(self.store.clone(), timers_stopped));
        let (closing, closing_seen) = tokio::sync::watch::channel(false);
        let app = app(AppState { store: self.store }, closing_seen);
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
        served
    }
}
