//! Commands that run parts of Starbridge in this process: the server, the built-in worker, dev
//! mode (both) and the demo.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::Args;
use starbridge_api::JobStatus;
use starbridge_core::definition::HTTP_COMMAND;
use starbridge_core::destination::DestinationPolicy;
use starbridge_engine::{Engine, NewToken, Scope, StoreOptions, SystemClock};
use starbridge_server::{Limits, Server};
use starbridge_worker::http::HttpExecutor;
use starbridge_worker::{Client, Secrets, Worker, shell};

use crate::Format;
use crate::client::{self, Context};

/// The example workflow the demo runs.
const DEMO_WORKFLOW: &str = include_str!("../../../examples/provision.yaml");

#[derive(Args)]
pub(crate) struct ServerArgs {
    /// Address to listen on.
    #[arg(long, env = "STARBRIDGE_LISTEN", default_value = "127.0.0.1:7433")]
    listen: String,
    #[command(flatten)]
    database: DatabaseArgs,
    /// Require an API token on every request (see `starbridge token`).
    #[arg(long, env = "STARBRIDGE_AUTH")]
    auth: bool,
    /// Serve a non-loopback address without authentication (only on a network you trust
    /// completely: anyone who reaches it can run and change anything).
    #[arg(long, conflicts_with = "auth")]
    insecure_no_auth: bool,
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, env = "STARBRIDGE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "STARBRIDGE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Let webhooks reach a destination refused by default (loopback, private, link-local and
    /// other local addresses, and localhost): a CIDR block (10.1.0.0/16), an address
    /// (127.0.0.1, ::1) or a host name (hooks.internal; *.internal for the names under it).
    /// Repeatable; the variable takes a comma-separated list (empty entries are ignored).
    #[arg(
        long = "webhook-allow",
        value_name = "CIDR_OR_HOST",
        env = "STARBRIDGE_WEBHOOK_ALLOW",
        value_delimiter = ','
    )]
    webhook_allow: Vec<String>,
    /// Export OpenTelemetry traces over OTLP/HTTP (protobuf) to this base URL (spans go to
    /// URL/v1/traces): a span per job, per task attempt and per API request. Off when unset.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    connections: ConnectionArgs,
}

/// How connections are bounded, and which host names a server without authentication answers.
#[derive(Args)]
pub(crate) struct ConnectionArgs {
    /// Longest wait for a request's head, the TLS handshake included (e.g. 10s).
    #[arg(long, env = "STARBRIDGE_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_timeout)]
    header_read_timeout: std::time::Duration,
    /// Close a connection that reads and writes nothing for this long while none of its
    /// requests is being answered (a long poll waiting for work is not idle).
    #[arg(long, env = "STARBRIDGE_IDLE_TIMEOUT", default_value = "75s", value_parser = parse_timeout)]
    idle_timeout: std::time::Duration,
    /// Most connections open at once; more wait in the listen backlog. Default: 80% of the
    /// file-descriptor limit (raised to its hard limit at start).
    #[arg(long, env = "STARBRIDGE_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: Option<u32>,
    /// A host name, besides localhost and IP addresses, that requests to a server without
    /// --auth may be addressed to (repeatable; the variable takes a comma-separated list).
    #[arg(
        long = "allowed-host",
        env = "STARBRIDGE_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
}

impl ConnectionArgs {
    fn limits(&self) -> starbridge_server::ConnectionLimits {
        let descriptors = raise_descriptor_limit();
        starbridge_server::ConnectionLimits {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            // The rest of the descriptors stays for the database, the log and the listener.
            max_connections: self.max_connections.map_or_else(
                || {
                    usize::try_from(descriptors / 5 * 4)
                        .unwrap_or(usize::MAX)
                        .max(1)
                },
                |max| max as usize,
            ),
        }
    }
}

/// Raises the process's soft file-descriptor limit to its hard limit; answers the limit now in
/// force.
fn raise_descriptor_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or_else(|error| {
        tracing::warn!(%error, "cannot read or raise the file-descriptor limit");
        starbridge_server::serve::DEFAULT_MAX_CONNECTIONS as u64 * 5 / 4
    })
}

/// A timeout longer than zero.
fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    match parse_duration(text)? {
        duration if duration.is_zero() => Err("must be longer than zero".to_owned()),
        duration => Ok(duration),
    }
}

/// Which database to use and how to connect to it.
#[derive(Args)]
pub(crate) struct DatabaseArgs {
    /// Database URL: sqlite://FILE (created on first start), or postgres://USER@HOST/DB for
    /// several server nodes sharing one PostgreSQL database.
    #[arg(
        long,
        env = "STARBRIDGE_DATABASE_URL",
        default_value = "sqlite://starbridge.db"
    )]
    database: String,
    /// Most read connections this node opens at once.
    #[arg(long, env = "STARBRIDGE_DB_POOL_SIZE", default_value_t = 8)]
    db_pool_size: usize,
    /// PostgreSQL: how long to wait for a connection (e.g. 5s).
    #[arg(long, env = "STARBRIDGE_DB_CONNECT_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    db_connect_timeout: std::time::Duration,
    /// PostgreSQL: longest a statement may run (e.g. 30s).
    #[arg(long, env = "STARBRIDGE_DB_STATEMENT_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    db_statement_timeout: std::time::Duration,
    /// PostgreSQL: longest a write waits for rows another node holds before it is retried.
    #[arg(long, env = "STARBRIDGE_DB_LOCK_TIMEOUT", default_value = "200ms", value_parser = parse_duration)]
    db_lock_timeout: std::time::Duration,
    /// Delete finished jobs (with their tasks and history) this long after they ended, or
    /// `forever` to keep them.
    #[arg(long, env = "STARBRIDGE_RETAIN_FINISHED", default_value = "30d", value_parser = parse_retention)]
    retain_finished: Retention,
    /// `full`: every change is on disk before it is answered. `relaxed`: answered once the
    /// database has it (SQLite's log not synced first, PostgreSQL synchronous_commit=off): a crash
    /// of this process loses nothing, but a power loss or an operating system crash may lose the
    /// last moments' changes, though acknowledged.
    #[arg(
        long,
        env = "STARBRIDGE_DURABILITY",
        value_enum,
        default_value = "full"
    )]
    durability: DurabilityArg,
}

/// The values of `--durability`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DurabilityArg {
    Full,
    Relaxed,
}

impl From<DurabilityArg> for starbridge_engine::Durability {
    fn from(arg: DurabilityArg) -> starbridge_engine::Durability {
        match arg {
            DurabilityArg::Full => starbridge_engine::Durability::Full,
            DurabilityArg::Relaxed => starbridge_engine::Durability::Relaxed,
        }
    }
}

/// How long finished jobs are kept.
#[derive(Clone, Copy)]
pub(crate) struct Retention(Option<starbridge_core::time::Duration>);

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    starbridge_core::time::Duration::parse(text)
        .map(|d| std::time::Duration::from_millis(d.as_millis()))
        .map_err(|error| format!("{error} (examples: 500ms, 5s, 2m)"))
}

fn parse_retention(text: &str) -> Result<Retention, String> {
    if text == "forever" {
        return Ok(Retention(None));
    }
    match starbridge_core::time::Duration::parse(text) {
        Ok(d) if d.as_millis() > 0 => Ok(Retention(Some(d))),
        Ok(_) => Err("must be longer than zero, or `forever`".to_owned()),
        Err(error) => Err(format!("{error} (examples: 7d, 12h, forever)")),
    }
}

impl DatabaseArgs {
    pub(crate) fn url(&self) -> &str {
        &self.database
    }

    pub(crate) fn options(&self) -> StoreOptions {
        StoreOptions {
            read_pool: self.db_pool_size,
            connect_timeout: self.db_connect_timeout,
            statement_timeout: self.db_statement_timeout,
            lock_timeout: self.db_lock_timeout,
            retain_finished: self.retain_finished.0,
            limits: starbridge_core::limits::Limits::default(),
            durability: self.durability.into(),
        }
    }
}

/// Hard limits; sizes take a unit (`KiB`, `MiB`) or a plain number of bytes. A request over one
/// is refused (413 or 422) with a problem naming the limit and this setting.
#[derive(Args)]
pub(crate) struct LimitArgs {
    /// Largest request body.
    #[arg(long, env = "STARBRIDGE_MAX_BODY_BYTES", default_value = "4MiB", value_parser = parse_size)]
    max_body_bytes: usize,
    /// Largest workflow definition (as sent, and once parsed).
    #[arg(long, env = "STARBRIDGE_MAX_DEFINITION_BYTES", default_value = "1MiB", value_parser = parse_size)]
    max_definition_bytes: usize,
    /// Most steps in one workflow (at most 1000).
    #[arg(long, env = "STARBRIDGE_MAX_STEPS", default_value_t = starbridge_core::definition::MAX_STEPS)]
    max_steps: usize,
    /// Most items one `for_each` expands to; a wider fan-out fails its step.
    #[arg(long, env = "STARBRIDGE_MAX_FAN_OUT", default_value_t = starbridge_core::limits::DEFAULT_MAX_FAN_OUT)]
    max_fan_out: usize,
    /// Largest task input, output, progress, logs or error message (as JSON).
    #[arg(long, env = "STARBRIDGE_MAX_TASK_BYTES", default_value = "256KiB", value_parser = parse_size)]
    max_task_bytes: usize,
    /// Largest job params (as JSON).
    #[arg(long, env = "STARBRIDGE_MAX_PARAMS_BYTES", default_value = "64KiB", value_parser = parse_size)]
    max_params_bytes: usize,
    /// Longest job key (at most 256).
    #[arg(long, env = "STARBRIDGE_MAX_KEY_BYTES", default_value_t = starbridge_server::limits::MAX_KEY_BYTES)]
    max_key_bytes: usize,
    /// Longest workflow, queue, schedule or worker name (at most 128).
    #[arg(long, env = "STARBRIDGE_MAX_NAME_BYTES", default_value_t = starbridge_server::limits::MAX_NAME_BYTES)]
    max_name_bytes: usize,
    /// Largest `limit` of a list request.
    #[arg(long, env = "STARBRIDGE_MAX_PAGE_SIZE", default_value_t = starbridge_server::limits::DEFAULT_MAX_PAGE_SIZE)]
    max_page_size: u32,
    /// Most signals one job keeps that no step has taken yet; more are refused (409).
    #[arg(long, env = "STARBRIDGE_MAX_PENDING_SIGNALS", default_value_t = starbridge_core::limits::DEFAULT_MAX_PENDING_SIGNALS)]
    max_pending_signals: usize,
    /// How deep sub-workflows may nest (a job's children are at depth 1); a child that would
    /// go deeper fails its parent's step.
    #[arg(long, env = "STARBRIDGE_MAX_WORKFLOW_DEPTH", default_value_t = starbridge_core::limits::DEFAULT_MAX_WORKFLOW_DEPTH)]
    max_workflow_depth: u32,
    /// Most labels one job carries (its workflow's and its submission's merged).
    #[arg(long, env = "STARBRIDGE_MAX_LABELS", default_value_t = starbridge_core::limits::DEFAULT_MAX_LABELS)]
    max_labels: usize,
}

impl LimitArgs {
    fn limits(&self) -> Result<Limits> {
        let limits = Limits {
            body_bytes: self.max_body_bytes,
            definition_bytes: self.max_definition_bytes,
            steps: self.max_steps,
            params_bytes: self.max_params_bytes,
            key_bytes: self.max_key_bytes,
            name_bytes: self.max_name_bytes,
            page_size: self.max_page_size,
            run: starbridge_core::limits::Limits {
                fan_out: self.max_fan_out,
                task_bytes: self.max_task_bytes,
                pending_signals: self.max_pending_signals,
                workflow_depth: self.max_workflow_depth,
                labels: self.max_labels,
            },
        };
        limits.validate()?;
        Ok(limits)
    }
}

/// A size in bytes: `262144`, `256KiB`, `4MiB` (also `KB`/`MB`/`K`/`M`, all powers of 1024).
fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: usize = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size such as 262144, 256KiB or 4MiB"))?;
    let factor: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit '{other}': use KiB, MiB or GiB")),
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("'{text}' is too large"))
}

impl ServerArgs {
    async fn start(&self) -> Result<(Server, String)> {
        // Settings first, so a bad one is reported before the database is touched.
        let limits = self.limits.limits()?;
        let webhook_policy = DestinationPolicy::allowing(
            self.webhook_allow
                .iter()
                .filter(|entry| !entry.trim().is_empty()),
        )
        .map_err(|error| anyhow::anyhow!("invalid --webhook-allow entry: {error}"))?;
        if !webhook_policy.allowed().is_empty() {
            let allowed: Vec<String> = webhook_policy
                .allowed()
                .iter()
                .map(ToString::to_string)
                .collect();
            tracing::info!(
                allowed = %allowed.join(", "),
                "webhooks may also reach these destinations (--webhook-allow)"
            );
        }
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(starbridge_server::tls::server_config(cert, key)?),
            _ => None,
        };
        let database = &self.database;
        let options = StoreOptions {
            limits: limits.run,
            ..database.options()
        };
        let store = Engine::open_with(database.url(), options, Arc::new(SystemClock))
            .with_context(|| format!("cannot open {}", database.url()))?;
        if let Some(endpoint) = self
            .otlp_endpoint
            .as_deref()
            .filter(|endpoint| !endpoint.trim().is_empty())
        {
            store.export_traces(endpoint)?;
            tracing::info!(endpoint, "exporting traces over OTLP (--otlp-endpoint)");
        }
        let mut server = Server::bind(store.clone(), &self.listen)
            .await?
            .with_limits(limits)
            .with_connection_limits(self.connections.limits())
            .with_allowed_hosts(self.connections.allowed_hosts.clone())
            .with_webhook_policy(webhook_policy);
        if let Some(tls) = tls {
            server = server.with_tls(tls);
        }
        let url = server.url();
        let loopback = server.local_addr().ip().is_loopback();
        if self.auth {
            if store.active_tokens().await? == 0 {
                tracing::warn!(
                    "authentication is on and no token exists yet: create the first admin token \
                     on this machine with `starbridge token bootstrap --database {}`",
                    database.url()
                );
            }
            return Ok((server.with_auth(), url));
        }
        if !loopback {
            if !self.insecure_no_auth {
                anyhow::bail!(
                    "refusing to serve {} without authentication: pass --auth (and create tokens \
                     with `starbridge token bootstrap`), or --insecure-no-auth on a network you \
                     trust completely",
                    server.local_addr()
                );
            }
            tracing::warn!(
                address = %server.local_addr(),
                "serving without authentication on a non-loopback address (--insecure-no-auth): \
                 anyone who reaches it can run and change anything"
            );
        }
        Ok((server, url))
    }
}

/// Makes the first admin token directly in the database and prints it once.
pub(crate) async fn bootstrap_token(name: &str, database: &DatabaseArgs) -> Result<ExitCode> {
    let store = Engine::open_with(
        database.url(),
        database.options(),
        std::sync::Arc::new(SystemClock),
    )
    .with_context(|| format!("cannot open {}", database.url()))?;
    let active = store.active_tokens().await?;
    if active > 0 {
        eprintln!(
            "note: {active} token(s) exist already; use `starbridge token create` with an admin \
             token to make more"
        );
    }
    let (token, secret) = store
        .create_token(NewToken {
            name: name.to_owned(),
            namespace: None,
            scopes: vec![Scope::Admin],
            queues: None,
            created_by: "bootstrap".to_owned(),
        })
        .await?;
    eprintln!(
        "admin token '{}' ({}) created; it is shown once:",
        token.name, token.id
    );
    println!("{secret}");
    Ok(ExitCode::SUCCESS)
}

/// `starbridge db ...`: database maintenance.
#[derive(clap::Subcommand)]
pub(crate) enum DbCommand {
    /// Apply the schema migrations this version needs (servers also do this when they start;
    /// nodes starting together take turns).
    Migrate(DatabaseArgs),
}

pub(crate) fn db(command: &DbCommand) -> Result<ExitCode> {
    match command {
        DbCommand::Migrate(args) => {
            let applied = Engine::migrate(args.url(), &args.options())
                .with_context(|| format!("cannot migrate {}", args.url()))?;
            println!("{applied} migration(s) applied; the schema is up to date");
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[derive(Args)]
pub(crate) struct WorkerArgs {
    /// Queue to take tasks from (repeatable).
    #[arg(long = "queue", short = 'q', required = true)]
    queues: Vec<String>,
    /// Most tasks run at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Name shown on the tasks this worker runs (default: host and process id).
    #[arg(long)]
    worker_id: Option<String>,
    #[command(flatten)]
    executors: ExecutorArgs,
}

/// How the built-in executors run: the HTTP executor's secrets and destinations.
#[derive(Args)]
pub(crate) struct ExecutorArgs {
    /// Secrets the HTTP executor may put into requests: a YAML file mapping each name to the
    /// environment variable holding its value and the hosts it may be sent to
    /// (`CMDB_TOKEN: {env: CMDB_TOKEN, hosts: [cmdb.internal]}`).
    #[arg(long, value_name = "FILE", env = "STARBRIDGE_SECRETS")]
    secrets: Option<PathBuf>,
    /// Let http steps reach a destination refused by default (loopback, link-local, metadata
    /// and other host-local addresses, and localhost; private ranges are allowed): a CIDR
    /// block, an address or a host name (*.internal for the names under it). Repeatable; the
    /// variable takes a comma-separated list.
    #[arg(
        long = "http-allow",
        value_name = "CIDR_OR_HOST",
        env = "STARBRIDGE_HTTP_ALLOW",
        value_delimiter = ','
    )]
    http_allow: Vec<String>,
}

impl ExecutorArgs {
    /// The HTTP executor these settings describe, trusting `ca_cert` too.
    fn http_executor(&self, ca_cert: Option<&std::path::Path>) -> Result<HttpExecutor> {
        let policy = DestinationPolicy::allowing(
            self.http_allow
                .iter()
                .filter(|entry| !entry.trim().is_empty()),
        )
        .map_err(|error| anyhow::anyhow!("invalid --http-allow entry: {error}"))?
        .private_network();
        let secrets = match &self.secrets {
            Some(path) => {
                Secrets::load(path).with_context(|| format!("--secrets {}", path.display()))?
            }
            None => Secrets::default(),
        };
        let pem = match ca_cert {
            Some(path) => Some(
                std::fs::read(path)
                    .with_context(|| format!("--ca-cert {}: cannot read it", path.display()))?,
            ),
            None => None,
        };
        Ok(HttpExecutor::new(policy, secrets, pem.as_deref())?)
    }
}

#[derive(Args)]
pub(crate) struct DevArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Queues the built-in worker serves (repeatable).
    #[arg(long = "queue", short = 'q', default_values_t = vec!["shell".to_owned()])]
    queues: Vec<String>,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    #[command(flatten)]
    executors: ExecutorArgs,
}

#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Database for the demo (default: a fresh file in a temporary folder).
    #[arg(long)]
    database: Option<String>,
    /// Run the happy path instead of the failing load that is rolled back.
    #[arg(long)]
    succeed: bool,
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}

fn default_worker_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    format!("{host}-{}", std::process::id())
}

/// The built-in worker: `http` steps' tasks go to the HTTP executor, every other task to the
/// shell executor.
fn builtin_worker(
    client: Client,
    namespace: &str,
    queues: &[String],
    concurrency: usize,
    worker_id: String,
    http: HttpExecutor,
) -> Result<Worker> {
    let mut builder = Worker::builder(client)
        .worker_id(worker_id)
        .namespace(namespace)
        .queues(queues.iter().cloned())
        .concurrency(concurrency)
        .command(HTTP_COMMAND, http);
    for queue in queues {
        builder = builder.fallback(queue, shell::ShellExecutor::default());
    }
    Ok(builder.build()?)
}

async fn start_server(listen: &str, database: &str, limits: Limits) -> Result<Server> {
    let options = StoreOptions {
        limits: limits.run,
        ..StoreOptions::default()
    };
    let store = Engine::open_with(database, options, Arc::new(SystemClock))
        .with_context(|| format!("cannot open {database}"))?;
    Ok(Server::bind(store, listen).await?.with_limits(limits))
}

pub(crate) async fn server(args: ServerArgs) -> Result<ExitCode> {
    let (server, url) = args.start().await?;
    tracing::info!(%url, database = %args.database.url(), "starbridge server listening (web UI at {url}/)");
    if args.database.durability == DurabilityArg::Relaxed {
        tracing::warn!(
            "durability relaxed: changes are answered before they reach the disk; a power loss \
             or an operating system crash may lose the last ones"
        );
    }
    server.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn worker(
    context: &Context,
    args: WorkerArgs,
    ca_cert: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let http = args.executors.http_executor(ca_cert)?;
    let worker_id = args.worker_id.unwrap_or_else(default_worker_id);
    tracing::warn!(
        queues = ?args.queues,
        "the shell executor runs commands from workflow definitions on this machine with this process's privileges: serve only queues whose workflows you trust"
    );
    let worker = builtin_worker(
        context.client.clone(),
        &context.namespace,
        &args.queues,
        args.concurrency,
        worker_id,
        http,
    )?;
    worker.run(shutdown_signal()).await;
    Ok(ExitCode::SUCCESS)
}

/// The server and a shell worker in one process; the worker serves `namespace` (`--namespace`).
pub(crate) async fn dev(
    args: DevArgs,
    namespace: &str,
    ca_cert: Option<&std::path::Path>,
) -> Result<ExitCode> {
    let http = args.executors.http_executor(ca_cert)?;
    let (server, url) = args.server.start().await?;
    tracing::info!(%url, database = %args.server.database.url(), queues = ?args.queues, "starbridge dev: server and built-in worker (web UI at {url}/)");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut server_stopped = stopped.clone();
    let server = tokio::spawn(server.run(async move {
        let _ = server_stopped.wait_for(|stop| *stop).await;
    }));
    let worker = builtin_worker(
        client::connect(&url, ca_cert)?,
        namespace,
        &args.queues,
        args.concurrency,
        default_worker_id(),
        http,
    )?;
    worker.run(shutdown_signal()).await;
    let _ = stop.send(true);
    server.await??;
    drop(stopped);
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn demo(args: DemoArgs) -> Result<ExitCode> {
    let folder = tempfile_dir()?;
    let database = args
        .database
        .unwrap_or_else(|| format!("sqlite://{}", folder.join("demo.db").display()));
    let server = start_server("127.0.0.1:0", &database, Limits::default()).await?;
    let url = server.url();
    eprintln!("demo: server at {url}, database {database}");
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let mut server_stop = stop.subscribe();
    let server = tokio::spawn(server.run(async move {
        let _ = server_stop.wait_for(|stop| *stop).await;
    }));
    let http = HttpExecutor::new(
        DestinationPolicy::default().private_network(),
        Secrets::default(),
        None,
    )?;
    let worker = builtin_worker(
        Client::new(url.clone())?,
        starbridge_api::DEFAULT_NAMESPACE,
        &["shell".to_owned()],
        4,
        "demo-worker".to_owned(),
        http,
    )?;
    let worker = tokio::spawn(worker.run(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    }));

    let context = Context::new(&url, None, "default", None, Format::Table)?;
    eprintln!("demo: applying examples/provision.yaml");
    client::apply_document(&context, "provision_database", DEMO_WORKFLOW).await?;
    let fail = !args.succeed;
    if fail {
        eprintln!(
            "demo: submitting a job whose load_data step fails, so finished steps are rolled back"
        );
    } else {
        eprintln!("demo: submitting a job that succeeds");
    }
    let started = std::time::Instant::now();
    let submitted = context
        .client
        .submit(&starbridge_api::SubmitJob {
            workflow: Some("provision_database".to_owned()),
            params: Some(
                serde_json::json!({"name": "orders", "size_gb": 20, "fail_at_load": fail}),
            ),
            ..Default::default()
        })
        .await?;
    let id = submitted.summary.id;
    eprintln!("demo: follow it in the web UI at {url}/ui/jobs/{id}");
    client::watch(&context, &id).await?;
    let took = started.elapsed();
    println!();
    client::job(&context, &id).await?;
    let job = context.client.job(&id).await?;
    eprintln!(
        "\ndemo: job ended {} after {:.1}s (database kept at {database}); rerun with --succeed for the happy path",
        job.summary.status,
        took.as_secs_f64()
    );
    let _ = stop.send(true);
    worker.await?;
    server.await??;
    let expected = if fail {
        JobStatus::Failed
    } else {
        JobStatus::Succeeded
    };
    Ok(if job.summary.status == expected {
        ExitCode::SUCCESS
    } else {
        eprintln!("demo: expected the job to end {expected}");
        ExitCode::FAILURE
    })
}

/// A fresh folder under the system's temporary directory for the demo's files.
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let folder = std::env::temp_dir().join(format!("starbridge-demo-{}", std::process::id()));
    std::fs::create_dir_all(&folder)?;
    Ok(folder)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_units_or_plain_bytes() {
        assert_eq!(parse_size("262144"), Ok(262_144));
        assert_eq!(parse_size("256KiB"), Ok(256 * 1024));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("1 mb"), Ok(1 << 20));
        assert!(
            parse_size("4TiB")
                .unwrap_err()
                .contains("unknown size unit")
        );
        assert!(parse_size("big").is_err());
        assert!(parse_size("").is_err());
    }
}
