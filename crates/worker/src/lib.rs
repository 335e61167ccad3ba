//! Worker SDK for Starbridge.
//!
//! - [`Client`]: the typed HTTP client of the Starbridge API (`starbridge_api::client`,
//!   re-exported here), with errors that say whether a retry can help.
//! - [`Worker`]: polls queues for tasks, runs them with registered handlers under a concurrency
//!   bound, heartbeats their leases, reports outcomes reliably and shuts down gracefully.
//! - [`shell`]: the built-in shell executor, a handler running the task's command with `sh -c`.
//! - [`http`]: the built-in HTTP executor, running `http` steps' requests, with [`Secrets`]
//!   resolved on the worker.
//!
//! ```no_run
//! use starbridge_worker::{Client, Outcome, TaskContext, Worker, shell::ShellExecutor};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // STARBRIDGE_SERVER and STARBRIDGE_TOKEN (when the server requires API tokens).
//! let client = Client::from_env()?;
//! let worker = Worker::builder(client)
//!     .queues(["mysql", "ops"])
//!     .concurrency(8)
//!     .handler("mysql", "init_instance", |task: TaskContext| async move {
//!         let size = task.input()["size_gb"].as_u64().unwrap_or(10);
//!         Outcome::complete(serde_json::json!({ "size_gb": size }))
//!     })
//!     .fallback("ops", ShellExecutor::new())
//!     .build()?;
//! worker.run(async { let _ = tokio::signal::ctrl_c().await; }).await;
//! # Ok(())
//! # }
//! ```

mod completions;
mod context;
pub mod http;
mod outcome;
mod secrets;
pub mod shell;
mod worker;

pub use context::TaskContext;
pub use outcome::{BoxFuture, Handler, HandlerResult, Outcome};
pub use secrets::{SecretError, Secrets, SecretsFileError};
pub use starbridge_api::client::{Client, DEFAULT_REQUEST_TIMEOUT, Error};
pub use worker::{
    BuildError, DEFAULT_CONCURRENCY, DEFAULT_POLL_WAIT, DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX,
    DEFAULT_SHUTDOWN_GRACE, Worker, WorkerBuilder,
};
