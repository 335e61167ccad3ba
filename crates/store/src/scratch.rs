//! Scratch PostgreSQL schemas: each test (and each `starbridge bench` run on PostgreSQL) gets a
//! schema of its own, dropped when it ends, so runs share one database without seeing each
//! other.
//!
//! Tests use `STARBRIDGE_TEST_POSTGRES` (default `postgres://$USER@127.0.0.1:5432/test`).
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
    /// The server's URL, without the schema.
    server: String,
    name: String,
    keep: bool,
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
        match ScratchSchema::create_on(&server, label) {
            Ok(schema) => Some(schema),
            Err(error) => {
                assert!(
                    !required(),
                    "PostgreSQL tests are required here but {server} cannot be used: {error}"
                );
                eprintln!(
                    "SKIPPED: PostgreSQL at {server} is not reachable ({error}); set \
                     STARBRIDGE_TEST_POSTGRES to a server to run the PostgreSQL tests"
                );
                None
            }
        }
    }

    /// A fresh schema named after `label` on the server at `server`.
    pub fn create_on(server: &str, label: &str) -> Result<ScratchSchema, String> {
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
        let create = format!("CREATE SCHEMA {name}");
        run(server, move |client| client.batch_execute(&create))?;
        let separator = if server.contains('?') { '&' } else { '?' };
        Ok(ScratchSchema {
            url: format!("{server}{separator}options=-csearch_path%3D{name}"),
            server: server.to_owned(),
            name,
            keep: false,
        })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Leaves the schema in place when dropped.
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Bytes the schema's tables take, with their indexes and TOAST data.
    pub fn size_bytes(&self) -> Result<u64, String> {
        let name = self.name.clone();
        run(&self.server, move |client| {
            let row = client.query_one(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::BIGINT FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind = 'r'",
                &[&name],
            )?;
            Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
    }

    /// The server's durability settings, as `synchronous_commit=… fsync=…`.
    pub fn durability(&self) -> Result<String, String> {
        run(&self.server, |client| {
            let setting = |client: &mut postgres::Client, name: &str| {
                client
                    .query_one(&format!("SHOW {name}"), &[])
                    .map(|row| format!("{name}={}", row.get::<_, String>(0)))
            };
            Ok(format!(
                "{} {}",
                setting(client, "synchronous_commit")?,
                setting(client, "fsync")?
            ))
        })
    }
}

/// Runs `work` with a fresh connection to `server` on a thread of its own.
fn run<T: Send + 'static>(
    server: &str,
    work: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error> + Send + 'static,
) -> Result<T, String> {
    let server = server.to_owned();
    blocking(move || {
        let mut config: Config = server.parse().map_err(|e| format!("{e}"))?;
        config.connect_timeout(Duration::from_secs(3));
        let mut client = config.connect(NoTls).map_err(|e| format!("{e}"))?;
        work(&mut client).map_err(|e| format!("{e}"))
    })
}

impl Drop for ScratchSchema {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let drop = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        if let Err(error) = run(&self.server, move |client| client.batch_execute(&drop)) {
            eprintln!("could not drop schema {}: {error}", self.name);
        }
    }
}
