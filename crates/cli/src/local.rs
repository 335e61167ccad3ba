//! Commands that run parts of Starbridge in this process: the server, the built-in worker, dev
//! mode (both) and the demo.

use std::process::ExitCode;

use anyhow::{Context as _, Result};
use clap::Args;
use starbridge_server::Server;
use starbridge_store::Store;
use starbridge_worker::{Client, Worker, shell};

use crate::Format;
use crate::client::{self, Context};

/// The example workflow the demo runs.
const DEMO_WORKFLOW: &str = include_str!("../../../examples/provision.yaml");

#[derive(Args)]
pub(crate) struct ServerArgs {
    /// Address to listen on.
    #[arg(long, env = "STARBRIDGE_LISTEN", default_value = "127.0.0.1:7433")]
    listen: String,
    /// Database URL: sqlite://FILE (created on first start).
    #[arg(
        long,
        env = "STARBRIDGE_DATABASE_URL",
        default_value = "sqlite://starbridge.db"
    )]
    database: String,
}

impl ServerArgs {
    async fn start(&self) -> Result<(Server, String)> {
        start_server(&self.listen, &self.database).await
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
}

#[derive(Args)]
pub(crate) struct DevArgs {
    #[command(flatten)]
    server: ServerArgs,
    /// Queues the built-in shell worker serves (repeatable).
    #[arg(long = "queue", short = 'q', default_values_t = vec!["shell".to_owned()])]
    queues: Vec<String>,
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
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

fn shell_worker(
    client: Client,
    namespace: &str,
    queues: &[String],
    concurrency: usize,
    worker_id: String,
) -> Result<Worker> {
    let mut builder = Worker::builder(client)
        .worker_id(worker_id)
        .namespace(namespace)
        .queues(queues.iter().cloned())
        .concurrency(concurrency);
    for queue in queues {
        builder = builder.fallback(queue, shell::ShellExecutor::default());
    }
    Ok(builder.build()?)
}

async fn start_server(listen: &str, database: &str) -> Result<(Server, String)> {
    let store = Store::open(database).with_context(|| format!("cannot open {database}"))?;
    let server = Server::bind(store, listen).await?;
    let url = format!("http://{}", server.local_addr());
    Ok((server, url))
}

pub(crate) async fn server(args: ServerArgs) -> Result<ExitCode> {
    let (server, url) = args.start().await?;
    tracing::info!(%url, database = %args.database, "starbridge server listening (web UI at {url}/)");
    server.run(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn worker(context: &Context, args: WorkerArgs) -> Result<ExitCode> {
    let worker_id = args.worker_id.unwrap_or_else(default_worker_id);
    tracing::warn!(
        queues = ?args.queues,
        "the shell executor runs commands from workflow definitions on this machine with this process's privileges: serve only queues whose workflows you trust"
    );
    let worker = shell_worker(
        context.client.clone(),
        &context.namespace,
        &args.queues,
        args.concurrency,
        worker_id,
    )?;
    worker.run(shutdown_signal()).await;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn dev(args: DevArgs) -> Result<ExitCode> {
    let (server, url) = args.server.start().await?;
    tracing::info!(%url, database = %args.server.database, queues = ?args.queues, "starbridge dev: server and shell worker (web UI at {url}/)");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut server_stopped = stopped.clone();
    let server = tokio::spawn(server.run(async move {
        let _ = server_stopped.wait_for(|stop| *stop).await;
    }));
    let worker = shell_worker(
        Client::new(url)?,
        starbridge_api::DEFAULT_NAMESPACE,
        &args.queues,
        args.concurrency,
        default_worker_id(),
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
    let (server, url) = start_server("127.0.0.1:0", &database).await?;
    eprintln!("demo: server at {url}, database {database}");
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let mut server_stop = stop.subscribe();
    let server = tokio::spawn(server.run(async move {
        let _ = server_stop.wait_for(|stop| *stop).await;
    }));
    let worker = shell_worker(
        Client::new(url.clone())?,
        starbridge_api::DEFAULT_NAMESPACE,
        &["shell".to_owned()],
        4,
        "demo-worker".to_owned(),
    )?;
    let worker = tokio::spawn(worker.run(async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    }));

    let context = Context::new(&url, "default", Format::Table)?;
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
    let submitted: starbridge_api::JobView = context
        .client
        .post_json(
            "/api/v1/jobs",
            &starbridge_api::SubmitJob {
                workflow: Some("provision_database".to_owned()),
                params: Some(
                    serde_json::json!({"name": "orders", "size_gb": 20, "fail_at_load": fail}),
                ),
                ..Default::default()
            },
        )
        .await?;
    let id = submitted.summary.id;
    eprintln!("demo: follow it in the web UI at {url}/ui/jobs/{id}");
    client::watch(&context, &id).await?;
    let took = started.elapsed();
    println!();
    client::job(&context, &id).await?;
    let job: starbridge_api::JobView = context
        .client
        .get_json(&format!("/api/v1/jobs/{id}"))
        .await?;
    eprintln!(
        "\ndemo: job ended {} after {:.1}s (database kept at {database}); rerun with --succeed for the happy path",
        job.summary.status,
        took.as_secs_f64()
    );
    let _ = stop.send(true);
    worker.await?;
    server.await??;
    let expected = if fail { "failed" } else { "succeeded" };
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
