//! Tests of the shell executor against real `sh` processes.

use std::io::Read;
use std::time::Duration;

use serde_json::{Value, json};
use starbridge_api::{LeasedTask, TaskKind, timestamp_from_millis};

use super::*;

fn task(command: &str, input: Value) -> TaskContext {
    TaskContext::new(leased(command, input))
}

fn leased(command: &str, input: Value) -> LeasedTask {
    LeasedTask {
        id: "tsk_1".to_owned(),
        lease_token: "lease".to_owned(),
        job_id: "job_1".to_owned(),
        step: "build".to_owned(),
        kind: TaskKind::Step.into(),
        item: None,
        queue: "ops".to_owned(),
        command: command.to_owned(),
        input,
        attempt: 2,
        idempotency_key: "job_1/build".to_owned(),
        lease_expires_at: timestamp_from_millis(0),
        lease_ms: 30_000,
        progress: None,
        callback_token: "sbc_1".to_owned(),
        traceparent: None,
    }
}

async fn run(command: &str) -> HandlerResult {
    ShellExecutor::new().run(task(command, json!({}))).await
}

fn logs(result: &HandlerResult) -> &Value {
    result
        .logs
        .as_ref()
        .expect("the shell executor always returns logs")
}

#[tokio::test]
async fn exit_zero_with_json_last_line_completes_with_that_object() {
    let result = run(r#"echo starting; echo '{"rows": 3}'; echo warn >&2"#).await;
    assert_eq!(result.outcome, Outcome::Complete(json!({"rows": 3})));
    let logs = logs(&result);
    assert_eq!(logs["stdout"], "starting\n{\"rows\": 3}\n");
    assert_eq!(logs["stderr"], "warn\n");
    assert_eq!(logs["exit_code"], 0);
    assert_eq!(logs["truncated"], false);
}

#[tokio::test]
async fn exit_zero_with_plain_output_completes_with_empty_object() {
    let result = run("echo done; echo '[1, 2]'").await;
    assert_eq!(result.outcome, Outcome::Complete(json!({})));
    let result = run("true").await;
    assert_eq!(result.outcome, Outcome::Complete(json!({})));
}

#[tokio::test]
async fn nonzero_exit_is_a_retryable_failure_quoting_the_last_stderr_line() {
    let result = run("echo first >&2; echo 'disk full' >&2; echo '' >&2; exit 3").await;
    assert_eq!(
        result.outcome,
        Outcome::Fail {
            message: "command exited with status 3: disk full".to_owned(),
            retryable: true,
            retry_after: None,
        }
    );
    assert_eq!(logs(&result)["exit_code"], 3);
    let result = run("exit 4").await;
    assert_eq!(
        result.outcome,
        Outcome::fail("command exited with status 4")
    );
}

#[tokio::test]
async fn retryable_false_on_the_last_stdout_line_makes_the_failure_permanent() {
    let result = run(r#"echo 'bad params' >&2; echo '{"retryable": false}'; exit 2"#).await;
    assert_eq!(
        result.outcome,
        Outcome::fail_permanently("command exited with status 2: bad params")
    );
}

#[tokio::test]
async fn exit_75_checks_later_after_the_given_ms_with_the_object_as_progress() {
    let result = run(r#"echo '{"after_ms": 1500, "phase": 2}'; exit 75"#).await;
    assert_eq!(
        result.outcome,
        Outcome::CheckLater {
            after: Duration::from_millis(1500),
            progress: Some(json!({"after_ms": 1500, "phase": 2})),
        }
    );
    let result = run("echo not yet; exit 75").await;
    assert_eq!(
        result.outcome,
        Outcome::CheckLater {
            after: DEFAULT_CHECK_LATER_AFTER,
            progress: None,
        }
    );
}

#[tokio::test]
async fn exit_76_awaits_a_callback_with_the_token_in_the_environment() {
    let result = run(
        r#"test "$STARBRIDGE_CALLBACK_TOKEN" = sbc_1 && echo '{"timeout_ms": 9000}' && exit 76"#,
    )
    .await;
    assert_eq!(
        result.outcome,
        Outcome::AwaitCallback {
            timeout: Some(Duration::from_millis(9000))
        }
    );
    let result = run("exit 76").await;
    assert_eq!(result.outcome, Outcome::AwaitCallback { timeout: None });
}

#[tokio::test]
async fn the_attempts_traceparent_is_in_the_environment_only_when_traced() {
    let script = r#"printf '{"traceparent": "%s"}\n' "${TRACEPARENT-unset}""#;
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut traced = leased(script, json!({}));
    traced.traceparent = Some(traceparent.to_owned());
    let result = ShellExecutor::new().run(TaskContext::new(traced)).await;
    assert_eq!(
        result.outcome,
        Outcome::Complete(json!({"traceparent": traceparent}))
    );
    let result = run(script).await;
    assert_eq!(
        result.outcome,
        Outcome::Complete(json!({"traceparent": "unset"}))
    );
}

#[tokio::test]
async fn input_is_on_stdin_and_in_the_environment() {
    let script = r#"read -r line
printf '{"stdin": %s, "env": %s, "task": "%s", "job": "%s", "step": "%s", "attempt": %s, "key": "%s"}\n' \
  "$line" "$STARBRIDGE_INPUT" "$STARBRIDGE_TASK_ID" "$STARBRIDGE_JOB_ID" "$STARBRIDGE_STEP" \
  "$STARBRIDGE_ATTEMPT" "$STARBRIDGE_IDEMPOTENCY_KEY""#;
    let input = json!({"size_gb": 20, "name": "db \"one\""});
    let result = ShellExecutor::new().run(task(script, input.clone())).await;
    assert_eq!(
        result.outcome,
        Outcome::Complete(json!({
            "stdin": input,
            "env": input,
            "task": "tsk_1",
            "job": "job_1",
            "step": "build",
            "attempt": 2,
            "key": "job_1/build",
        }))
    );
}

#[tokio::test]
async fn top_level_scalar_input_fields_are_exported_as_input_variables() {
    let result = ShellExecutor::new()
        .run(task(
            r#"echo "{\"out\": \"$INPUT_SIZE_GB|$INPUT_NAME|$INPUT_ON|$INPUT_DASHED_KEY|${INPUT_LIST-unset}\"}""#,
            json!({"size_gb": 20, "name": "db 1", "on": true, "dashed-key": null, "list": [1]}),
        ))
        .await;
    assert_eq!(
        result.outcome,
        Outcome::Complete(json!({"out": "20|db 1|true||unset"}))
    );
}

#[tokio::test]
async fn output_is_kept_to_its_last_bytes_and_marked_truncated() {
    let script = r#"i=0
while [ $i -lt 500 ]; do echo "out line $i"; echo "err line $i" >&2; i=$((i + 1)); done
echo '{"ok": true}'"#;
    let result = ShellExecutor::new()
        .max_output_bytes(1000)
        .run(task(script, json!({})))
        .await;
    assert_eq!(result.outcome, Outcome::Complete(json!({"ok": true})));
    let logs = logs(&result);
    let stdout = logs["stdout"].as_str().expect("stdout is text");
    let stderr = logs["stderr"].as_str().expect("stderr is text");
    assert_eq!(stdout.len(), 1000);
    assert!(
        stdout.ends_with("out line 499\n{\"ok\": true}\n"),
        "{stdout}"
    );
    assert_eq!(stderr.len(), 1000);
    assert!(stderr.ends_with("err line 499\n"), "{stderr}");
    assert_eq!(logs["truncated"], true);
}

#[tokio::test]
async fn a_json_output_line_longer_than_the_bound_is_a_permanent_failure() {
    let result = ShellExecutor::new()
        .max_output_bytes(16)
        .run(task(
            r#"echo '{"data": "0123456789abcdefghij"}'"#,
            json!({}),
        ))
        .await;
    assert!(
        matches!(&result.outcome, Outcome::Fail { message, retryable: false, .. } if message.contains("16-byte")),
        "{:?}",
        result.outcome
    );
}

#[tokio::test]
async fn a_command_killed_by_a_signal_is_a_retryable_failure_naming_it() {
    let result = run("kill -s TERM $$").await;
    assert_eq!(
        result.outcome,
        Outcome::fail("command was killed by signal 15 (SIGTERM)")
    );
    assert_eq!(logs(&result)["signal"], 15);
    assert_eq!(logs(&result)["exit_code"], Value::Null);
}

#[tokio::test]
async fn a_missing_shell_is_a_retryable_failure() {
    let result = ShellExecutor::new()
        .shell("/nonexistent/shell")
        .run(task("true", json!({})))
        .await;
    assert!(
        matches!(&result.outcome, Outcome::Fail { message, retryable: true, .. } if message.starts_with("could not start /nonexistent/shell")),
        "{:?}",
        result.outcome
    );
}

/// Runs `operation` on a thread of its own (not the runtime's blocking pool, which a hung
/// operation would keep the test runtime from shutting down), failing the test after 30 s.
async fn blocking<T: Send + 'static>(
    what: &str,
    operation: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> T {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = sender.send(operation());
    });
    tokio::time::timeout(Duration::from_secs(30), receiver)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
        .expect("the thread sends its result")
        .unwrap_or_else(|error| panic!("{what}: {error}"))
}

/// A command whose background process writes into a FIFO, and the FIFO opened for reading once
/// that process runs: end-of-file on it proves the process (so the command's whole process
/// group) was killed.
struct FifoCommand {
    _dir: tempfile::TempDir,
    context: TaskContext,
    fifo: std::path::PathBuf,
}

impl FifoCommand {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        let context = task(
            &format!("sleep 1000 > '{}' & wait", fifo.display()),
            json!({}),
        );
        FifoCommand {
            _dir: dir,
            context,
            fifo,
        }
    }

    /// Opening the FIFO for reading completes once the background `sleep` opened it for writing.
    async fn open_when_running(&self) -> std::fs::File {
        let path = self.fifo.clone();
        blocking("open the FIFO", move || std::fs::File::open(path)).await
    }
}

async fn assert_writer_killed(mut reader: std::fs::File) {
    let rest = blocking("read the FIFO to its end", move || {
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).map(|_| rest)
    })
    .await;
    assert!(rest.is_empty());
}

#[tokio::test]
async fn cancellation_kills_the_command_and_the_processes_it_started() {
    let command = FifoCommand::new();
    let running = tokio::spawn({
        let context = command.context.clone();
        async move { ShellExecutor::new().run(context).await }
    });
    let reader = command.open_when_running().await;

    command.context.cancel();
    let result = running.await.expect("the executor returns");
    assert_eq!(
        result.outcome,
        Outcome::fail("the task was cancelled; the command was killed")
    );
    assert_writer_killed(reader).await;
}

#[tokio::test]
async fn dropping_the_run_kills_the_command_and_the_processes_it_started() {
    let command = FifoCommand::new();
    let running = tokio::spawn({
        let context = command.context.clone();
        async move { ShellExecutor::new().run(context).await }
    });
    let reader = command.open_when_running().await;

    // What the worker does to a task abandoned at the end of the shutdown grace period.
    running.abort();
    assert!(running.await.is_err_and(|error| error.is_cancelled()));
    assert_writer_killed(reader).await;
}

#[tokio::test]
async fn an_http_steps_task_is_never_run_as_a_shell_command() {
    let result = run("http").await;
    assert!(
        matches!(&result.outcome, Outcome::Fail { retryable: false, message, .. } if message.contains("HTTP executor")),
        "{result:?}"
    );
    assert_eq!(result.logs, None, "no command ran");
}
