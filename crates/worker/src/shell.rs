//! The built-in shell executor: runs a task's `command` string with `sh -c`.
//!
//! # Security
//!
//! **This executes commands taken from workflow definitions on the worker's machine, with the
//! worker's privileges** (its user, its files, its network, its environment variables — including
//! any token the worker was given through the environment). Anyone who can apply a workflow
//! definition whose steps land on a queue served by this executor can run arbitrary code there.
//! Register it only for queues whose definitions you trust, and run the worker as an unprivileged
//! user.
//!
//! It never runs an `http` step's task (command `http`): that fails for good, pointing at the
//! HTTP executor.
//!
//! # Protocol between the worker and the command
//!
//! - The task input is written as JSON (one line) to the command's stdin and is also in the
//!   environment variable `STARBRIDGE_INPUT` (the OS limits the size of one variable — about
//!   128 KiB on Linux — so read stdin for large inputs). Also set: `STARBRIDGE_TASK_ID`,
//!   `STARBRIDGE_JOB_ID`, `STARBRIDGE_STEP`, `STARBRIDGE_ATTEMPT`, `STARBRIDGE_IDEMPOTENCY_KEY`,
//!   and `STARBRIDGE_CALLBACK_TOKEN` (the attempt's callback token, a secret: see exit 76).
//!   Each top-level scalar field of an object input is also exported as `INPUT_<NAME>` (upper
//!   case, other characters as `_`): `{"size_gb": 20}` gives `INPUT_SIZE_GB=20`.
//! - stdout and stderr are captured, each kept to its last [`DEFAULT_MAX_OUTPUT_BYTES`]
//!   (configurable), and reported as the task's logs:
//!   `{"stdout": …, "stderr": …, "exit_code": n, "truncated": bool}` (plus `"signal": n` when the
//!   command was killed by a signal; `exit_code` is then `null`).
//! - Exit 0 → the task completes; its output is the last non-empty stdout line if that parses as
//!   a JSON object, else `{}`.
//! - Exit 75 (`EX_TEMPFAIL`) → check later: the server hands the task out again after `after_ms`
//!   milliseconds taken from a last-line JSON object `{"after_ms": N, …}` (default 5000); the
//!   whole object is recorded as the task's progress, which the next run sees as
//!   `TaskContext::progress` (not passed to the command).
//! - Exit 76 → await a callback: the command handed the work to another system, giving it
//!   `STARBRIDGE_CALLBACK_TOKEN`; that system finishes the attempt with
//!   `POST /api/v1/callbacks/{token}/complete` (or `/fail`, `/heartbeat`). The worker lets go
//!   of the task; a last-line JSON object `{"timeout_ms": N}` bounds the wait (default: the
//!   step's per-attempt timeout).
//! - Any other exit → a retryable failure `command exited with status N: <last stderr line>`,
//!   non-retryable when the last stdout line is a JSON object with `"retryable": false`.
//! - Killed by a signal → a retryable failure naming the signal.
//! - When the task is cancelled (lease lost, or abandoned at worker shutdown), the command and
//!   everything it started are killed: the command runs in a process group of its own (on Unix),
//!   which is sent `SIGKILL`. Being in its own group also keeps a Ctrl-C aimed at the worker from
//!   killing running commands, so graceful shutdown can let them finish.
//! - Background processes left behind by a command that exited are not killed; their output is
//!   read for at most [`DEFAULT_OUTPUT_DRAIN`] more if they keep stdout/stderr open.

use std::ffi::OsString;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::{Map, Value, json};
use starbridge_api::client::shorten;
use starbridge_core::definition::HTTP_COMMAND;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tracing::warn;

use crate::context::{Signal, TaskContext};
use crate::outcome::{BoxFuture, Handler, HandlerResult, Outcome};
use crate::worker::AbortOnDrop;

/// How much of stdout and of stderr is kept by default (the end of each).
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// The exit status that asks to check later (`EX_TEMPFAIL` from `sysexits.h`).
pub const EXIT_CHECK_LATER: i32 = 75;
/// The exit status that hands the attempt to another system, which finishes it through the
/// callback token.
pub const EXIT_AWAIT_CALLBACK: i32 = 76;
/// The check-later delay when the command gives no `after_ms`.
pub const DEFAULT_CHECK_LATER_AFTER: Duration = Duration::from_millis(5000);
/// How long output is still read after the command exited, when a background process keeps the
/// pipes open.
pub const DEFAULT_OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// `INPUT_<NAME>` variables for the top-level scalar fields of an object input: strings as they
/// are, numbers and booleans as JSON text, null as empty. Names are upper-cased, and characters
/// other than letters, digits and `_` become `_`. Lists and objects are left to
/// `STARBRIDGE_INPUT` and stdin.
fn input_variables(input: &Value) -> Vec<(String, String)> {
    let Value::Object(fields) = input else {
        return Vec::new();
    };
    fields
        .iter()
        .filter_map(|(key, value)| {
            let text = match value {
                Value::String(text) => text.clone(),
                Value::Null => String::new(),
                Value::Bool(_) | Value::Number(_) => value.to_string(),
                Value::Array(_) | Value::Object(_) => return None,
            };
            let name: String = key
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_uppercase()
                    } else {
                        '_'
                    }
                })
                .collect();
            Some((format!("INPUT_{name}"), text))
        })
        .collect()
}

/// The longest stderr line quoted in a failure message.
const MAX_MESSAGE_LINE: usize = 1024;

/// Runs tasks as shell commands; see the [module docs](self), including the security note.
///
/// Use it as a fallback handler: `builder.fallback("ops", ShellExecutor::new())`.
#[derive(Debug, Clone)]
pub struct ShellExecutor {
    shell: OsString,
    max_output_bytes: usize,
    output_drain: Duration,
}

impl Default for ShellExecutor {
    fn default() -> Self {
        ShellExecutor {
            shell: OsString::from("sh"),
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            output_drain: DEFAULT_OUTPUT_DRAIN,
        }
    }
}

impl ShellExecutor {
    /// An executor running `sh -c <command>`, keeping the last 64 KiB of stdout and stderr.
    pub fn new() -> Self {
        ShellExecutor::default()
    }

    /// The shell program, called as `<shell> -c <command>` (default `sh`, found on `PATH`).
    pub fn shell(mut self, program: impl Into<OsString>) -> Self {
        self.shell = program.into();
        self
    }

    /// How many bytes of stdout and of stderr are kept (the last ones; default 64 KiB each).
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// How long output is still read after the command exited (default 2 s): only matters when
    /// a background process it started keeps stdout or stderr open.
    pub fn output_drain(mut self, drain: Duration) -> Self {
        self.output_drain = drain;
        self
    }

    /// Runs the task's command to its end (or until the task is cancelled).
    pub async fn run(&self, task: TaskContext) -> HandlerResult {
        if task.command() == HTTP_COMMAND {
            return Outcome::fail_permanently(
                "an http step's task: the shell executor does not run it (the built-in HTTP executor of `starbridge worker` does)",
            )
            .into();
        }
        let input = serde_json::to_string(task.input()).unwrap_or_else(|_| "null".to_owned());
        let mut command = Command::new(&self.shell);
        command
            .arg("-c")
            .arg(task.command())
            .env("STARBRIDGE_INPUT", &input)
            .env("STARBRIDGE_TASK_ID", task.id())
            .env("STARBRIDGE_JOB_ID", task.job_id())
            .env("STARBRIDGE_STEP", task.step())
            .env("STARBRIDGE_ATTEMPT", task.attempt().to_string())
            .env("STARBRIDGE_IDEMPOTENCY_KEY", task.idempotency_key())
            .env("STARBRIDGE_CALLBACK_TOKEN", task.callback_token())
            .envs(input_variables(task.input()))
            .envs(task.traceparent().map(|value| ("TRACEPARENT", value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(unix)]
        command.process_group(0);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                return Outcome::fail(format!(
                    "could not start {}: {error}",
                    self.shell.to_string_lossy()
                ))
                .into();
            }
        };
        // Kills the command's process group if this future is dropped before the command ends
        // (the task was abandoned); `kill_on_drop` alone would only kill the shell.
        let mut group = ProcessGroup { leader: child.id() };

        let _stdin_writer = child.stdin.take().map(|mut stdin| {
            AbortOnDrop(tokio::spawn(async move {
                // The command may exit without reading its input: ignore broken pipes.
                let _ = stdin.write_all(input.as_bytes()).await;
                let _ = stdin.write_all(b"\n").await;
            }))
        });
        let stop_reading = Signal::new();
        let limit = self.max_output_bytes;
        let stdout_reader = child.stdout.take().map(|stream| {
            AbortOnDrop(tokio::spawn(read_tail(stream, limit, stop_reading.clone())))
        });
        let stderr_reader = child.stderr.take().map(|stream| {
            AbortOnDrop(tokio::spawn(read_tail(stream, limit, stop_reading.clone())))
        });

        let status = tokio::select! {
            status = child.wait() => status,
            () = task.cancelled() => {
                group.kill();
                let _ = child.kill().await;
                return Outcome::fail("the task was cancelled; the command was killed").into();
            }
        };
        group.disarm();
        let status = match status {
            Ok(status) => status,
            Err(error) => {
                return Outcome::fail(format!("could not wait for the command: {error}")).into();
            }
        };

        let stop_timer = {
            let stop = stop_reading.clone();
            let drain = self.output_drain;
            AbortOnDrop(tokio::spawn(async move {
                tokio::time::sleep(drain).await;
                stop.set();
            }))
        };
        let stdout = collect(stdout_reader, limit).await;
        let stderr = collect(stderr_reader, limit).await;
        drop(stop_timer);
        if stdout.cut_short || stderr.cut_short {
            warn!(
                task_id = %task.id(),
                "a background process of the command kept its output open; output after exit is incomplete"
            );
        }
        interpret(status, &stdout, &stderr, limit)
    }
}

impl Handler for ShellExecutor {
    fn call(&self, task: TaskContext) -> BoxFuture<HandlerResult> {
        let executor = self.clone();
        Box::pin(async move { executor.run(task).await })
    }
}

/// The process group of a running command, killed on drop unless disarmed.
struct ProcessGroup {
    leader: Option<u32>,
}

impl ProcessGroup {
    /// Sends `SIGKILL` to the whole group (once).
    fn kill(&mut self) {
        let Some(leader) = self.leader.take() else {
            return;
        };
        if cfg!(unix) {
            // Without `unsafe` (forbidden here) there is no `killpg`; the shell's `kill` builtin
            // signals a group given as a negative id.
            let killed = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg("kill -s KILL -- \"-$1\" 2>/dev/null")
                .arg("sh")
                .arg(leader.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            if let Err(error) = killed {
                warn!(%error, pgid = leader, "could not kill the command's process group");
            }
        }
    }

    /// The command ended by itself: leave whatever it left running alone.
    fn disarm(&mut self) {
        self.leader = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The end of a byte stream, at most `limit` bytes of it.
#[derive(Debug)]
struct Tail {
    bytes: Vec<u8>,
    limit: usize,
    truncated: bool,
    /// Reading stopped before the end of the stream.
    cut_short: bool,
}

impl Tail {
    fn new(limit: usize) -> Self {
        Tail {
            bytes: Vec::new(),
            limit,
            truncated: false,
            cut_short: false,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        let excess = self.bytes.len().saturating_sub(self.limit);
        if excess > 0 {
            self.bytes.drain(..excess);
            self.truncated = true;
        }
    }
}

async fn read_tail(mut stream: impl AsyncRead + Unpin, limit: usize, stop: Signal) -> Tail {
    let mut tail = Tail::new(limit);
    let mut buffer = vec![0u8; 8192];
    loop {
        if stop.is_set() {
            tail.cut_short = true;
            break;
        }
        tokio::select! {
            read = stream.read(&mut buffer) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => tail.push(&buffer[..n]),
            },
            () = stop.wait() => {
                tail.cut_short = true;
                break;
            }
        }
    }
    tail
}

/// Captured output, as text.
#[derive(Debug)]
struct Captured {
    text: String,
    truncated: bool,
    cut_short: bool,
    /// The last line may have lost its beginning to truncation.
    last_line_cut: bool,
}

async fn collect(reader: Option<AbortOnDrop<Tail>>, limit: usize) -> Captured {
    let tail = match reader {
        Some(mut reader) => (&mut reader.0).await.unwrap_or_else(|_| Tail::new(limit)),
        None => Tail::new(limit),
    };
    let mut bytes: &[u8] = &tail.bytes;
    if tail.truncated {
        // Do not start in the middle of a UTF-8 character.
        while let Some((first, rest)) = bytes.split_first() {
            if first & 0b1100_0000 != 0b1000_0000 {
                break;
            }
            bytes = rest;
        }
    }
    let text = String::from_utf8_lossy(bytes).into_owned();
    let last_line_cut = tail.truncated && !text.trim_end().contains('\n');
    Captured {
        text,
        truncated: tail.truncated,
        cut_short: tail.cut_short,
        last_line_cut,
    }
}

/// The last non-empty line of `text`, trimmed.
fn last_line(text: &str) -> Option<&str> {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|line| !line.is_empty())
}

/// The last non-empty line of `text` if it is a JSON object.
fn last_json_object(text: &str) -> Option<Map<String, Value>> {
    match serde_json::from_str(last_line(text)?) {
        Ok(Value::Object(object)) => Some(object),
        _ => None,
    }
}

/// Turns the command's exit and output into the task's outcome and logs.
fn interpret(
    status: ExitStatus,
    stdout: &Captured,
    stderr: &Captured,
    limit: usize,
) -> HandlerResult {
    let signal = exit_signal(status);
    let mut logs = json!({
        "stdout": stdout.text,
        "stderr": stderr.text,
        "exit_code": status.code(),
        "truncated": stdout.truncated || stderr.truncated,
    });
    if let (Some(signal), Value::Object(map)) = (signal, &mut logs) {
        map.insert("signal".to_owned(), json!(signal));
    }
    let object = last_json_object(&stdout.text);
    let outcome = match (status.code(), signal) {
        (Some(0), _) => match object {
            Some(output) => Outcome::Complete(Value::Object(output)),
            None if stdout.last_line_cut
                && last_line(&stdout.text).is_some_and(|line| line.ends_with('}')) =>
            {
                Outcome::fail_permanently(format!(
                    "the command's last stdout line (its JSON output) is longer than the \
                     {limit}-byte output limit of the shell executor"
                ))
            }
            None => Outcome::Complete(json!({})),
        },
        (Some(EXIT_CHECK_LATER), _) => {
            let after = object
                .as_ref()
                .and_then(|object| object.get("after_ms"))
                .and_then(Value::as_u64)
                .map_or(DEFAULT_CHECK_LATER_AFTER, Duration::from_millis);
            Outcome::CheckLater {
                after,
                progress: object.map(Value::Object),
            }
        }
        (Some(EXIT_AWAIT_CALLBACK), _) => Outcome::AwaitCallback {
            timeout: object
                .as_ref()
                .and_then(|object| object.get("timeout_ms"))
                .and_then(Value::as_u64)
                .map(Duration::from_millis),
        },
        (Some(code), _) => {
            let message = match last_line(&stderr.text) {
                Some(line) => format!(
                    "command exited with status {code}: {}",
                    shorten(line, MAX_MESSAGE_LINE)
                ),
                None => format!("command exited with status {code}"),
            };
            let retryable = !matches!(
                object.as_ref().and_then(|object| object.get("retryable")),
                Some(Value::Bool(false))
            );
            Outcome::Fail {
                message,
                retryable,
                retry_after: None,
            }
        }
        (None, Some(signal)) => Outcome::fail(format!(
            "command was killed by signal {signal}{}",
            signal_name(signal)
                .map(|name| format!(" ({name})"))
                .unwrap_or_default()
        )),
        (None, None) => Outcome::fail("command ended without an exit status"),
    };
    HandlerResult {
        outcome,
        logs: Some(logs),
    }
}

#[cfg(unix)]
fn exit_signal(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

#[cfg(not(unix))]
fn exit_signal(_status: ExitStatus) -> Option<i32> {
    None
}

/// The name of a signal number (those numbered alike on Linux and macOS).
fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
