//! Callback tokens: every claim issues one for its attempt, and another system finishes (or
//! extends) the attempt through it, holding no API token (the callback token is the
//! credential).
//!
//! A token is `sbc_<task id>_<attempt>_<secret>`. The secret is random (256 bits), shown once
//! in the poll answer, and kept only as the first 128 bits of its SHA-256 on the task
//! (`secrets::callback_hash`), bound to that attempt; the state machine checks a presented
//! token's SHA-256 against it (see `machine::waits`). A token of an attempt that has ended
//! answers 410; one never issued 404.

use starbridge_core::ids::{JobId, TaskId};
use starbridge_core::model::{CallbackCall, Input, Task};
use starbridge_store::rows::RowLock;

use crate::ctx::WriteCtx;
use crate::secrets::hash;
use crate::{Error, Result};

use super::{apply, job_of_task, load_job, workflow_of};

const PREFIX: &str = "sbc_";

/// The callback token of the task's current attempt, from the secret its claim hashed.
pub(crate) fn callback_token(task: &Task, secret: &str) -> String {
    format!("{PREFIX}{}_{}_{secret}", task.id, task.attempt)
}

/// A presented token's task, attempt and secret, if it is well formed.
fn parse(token: &str) -> Option<(TaskId, u32, &str)> {
    let rest = token.strip_prefix(PREFIX)?;
    let (rest, secret) = rest.rsplit_once('_')?;
    let (task, attempt) = rest.rsplit_once('_')?;
    let well_formed = secret.len() == 64 && secret.bytes().all(|b| b.is_ascii_hexdigit());
    well_formed.then_some(())?;
    Some((TaskId::parse(task)?, attempt.parse().ok()?, secret))
}

/// What a call through a callback token reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackAccepted {
    pub job: JobId,
    pub task: TaskId,
}

/// A digest of what a call carries, so that an identical repeat of a `complete` or `fail` is
/// recognised (and answered as the first was).
fn digest(call: &CallbackCall) -> String {
    let text = match call {
        CallbackCall::Complete { output } => format!("complete\n{output}"),
        CallbackCall::Fail { error } => format!("fail\n{}\n{}", error.retryable, error.message),
        CallbackCall::Heartbeat => "heartbeat".to_owned(),
    };
    hash(&text)
}

/// A call through a callback token.
pub(crate) fn callback(
    ctx: &mut WriteCtx<'_>,
    token: &str,
    call: CallbackCall,
) -> Result<CallbackAccepted> {
    let unknown = || Error::NotFound("no such callback token".to_owned());
    let (task, attempt, secret) = parse(token).ok_or_else(unknown)?;
    let job = job_of_task(ctx, &task)?.ok_or_else(unknown)?;
    let mut state = load_job(ctx, &job, RowLock::Wait)?.ok_or_else(unknown)?;
    let compiled = workflow_of(ctx, &state)?;
    let input = Input::Callback {
        task: task.clone(),
        attempt,
        token_hash: hash(secret),
        digest: digest(&call),
        call,
    };
    let applied = apply(ctx, &compiled.workflow, &mut state, input);
    ctx.jobs.keep(state);
    applied?;
    Ok(CallbackAccepted { job, task })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_calls_share_a_digest_and_different_ones_do_not() {
        let complete = |output| CallbackCall::Complete { output };
        let a = digest(&complete(serde_json::json!({"a": 1})));
        assert_eq!(a, digest(&complete(serde_json::json!({"a": 1}))));
        assert_ne!(a, digest(&complete(serde_json::json!({"a": 2}))));
        assert_ne!(a, digest(&CallbackCall::Heartbeat));
    }

    #[test]
    fn a_token_names_its_task_and_attempt_and_reads_back() {
        let task = TaskId::from_unique("0192abcd");
        let secret = crate::secrets::random_hex();
        let token = format!("{PREFIX}{task}_3_{secret}");
        assert_eq!(parse(&token), Some((task, 3, secret.as_str())));
        for malformed in [
            "",
            "sbc_",
            "sbt_tsk_1_1_00",
            &format!("{PREFIX}tsk_1_x_{secret}"),
            &format!("{PREFIX}tsk_1_1_{}", &secret[1..]),
            &format!("{PREFIX}job_1_1_{secret}"),
        ] {
            assert_eq!(parse(malformed), None, "{malformed}");
        }
    }
}
