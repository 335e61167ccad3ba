//! Scratch PostgreSQL schemas for tests: each test gets a schema of its own on the test server,
//! dropped when the test ends, so tests run in parallel on one database without seeing each
//! other.
//!
//! The server is `STARBRIDGE_TEST_POSTGRES` (default `postgres://$USER@127.0.0.1:5432/test`).
//! When it cannot be reached the tests that need it are skipped with a message, unless
//! `STARBRIDGE_REQUIRE_POSTGRES` or `CI` is set: then they fail, so CI always runs them.

use std::time::Duration;

use postgres::{Config, NoTls};

/// The test server's URL.
pub fn server_url() -> String {
    std::env::var("STARBRIDGE_TEST_POSTGRES").unwrap_or_else(|_| {
        let user = std::env::var("USER").unwrap_or_else(|_| "postgres".to_owned());
        format!("postgres://{user}@127.0.0.1:5432/test")
    })
}

fn required() -> bool {
    ["STARBRIDGE_REQUIRE_POSTGRES", "CI"]
        .iter()
        .any(|name| std::env::var(name).is_ok_and(|value| !value.is_empty() && value != "0"))
}

/// A schema of its own on the test server; dropped with everything in it on drop.
pub struct ScratchSchema {
    /// A URL whose connections work in this schema.
    pub url: String,
    name: String,
}

/// Runs blocking client work on a thread of its own (tests call this from async code).
fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(work)
        .join()
        .expect("PostgreSQL test helper panicked")
}

impl ScratchSchema {
    /// A fresh schema, or `None` (after saying why) when no test server answers and none is
    /// required.
    pub fn create(label: &str) -> Option<ScratchSchema> {
        let server = server_url();
        let name = format!(
            "t_{}_{}",
            label
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(20)
                .collect::<String>()
                .to_lowercase(),
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let (created_server, created_name) = (server.clone(), name.clone());
        let created = blocking(move || -> Result<(), String> {
            let mut config: Config = created_server.parse().map_err(|e| format!("{e}"))?;
            config.connect_timeout(Duration::from_secs(3));
            let mut client = config.connect(NoTls).map_err(|e| format!("{e}"))?;
            client
                .batch_execute(&format!("CREATE SCHEMA {created_name}"))
                .map_err(|e| format!("{e}"))
        });
        if let Err(error) = created {
            assert!(
                !required(),
                "PostgreSQL tests are required here but {server} cannot be used: {error}"
            );
            eprintln!(
                "SKIPPED: PostgreSQL at {server} is not reachable ({error}); set \
                 STARBRIDGE_TEST_POSTGRES to a server to run the PostgreSQL tests"
            );
            return None;
        }
        let separator = if server.contains('?') { '&' } else { '?' };
        Some(ScratchSchema {
            url: format!("{server}{separator}options=-csearch_path%3D{name}"),
            name,
        })
    }
}

impl Drop for ScratchSchema {
    fn drop(&mut self) {
        let (server, name) = (server_url(), self.name.clone());
        let dropped = blocking(move || -> Result<(), String> {
            let config: Config = server.parse().map_err(|e| format!("{e}"))?;
            let mut client = config.connect(NoTls).map_err(|e| format!("{e}"))?;
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                .map_err(|e| format!("{e}"))
        });
        if let Err(error) = dropped {
            eprintln!("could not drop test schema {}: {error}", self.name);
        }
    }
}
