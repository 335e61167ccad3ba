//! The pure domain of Starbridge: workflow definitions and their validation, the expression
//! language, job labels, the job and task state machines, and retry arithmetic; where tasks go
//! (`routing`: queue templates and patterns); API token scopes (`scope`); what webhook subscribers may hear of (`webhook`); W3C trace context (`trace`);
//! and every closed set of values the HTTP API carries as strings, with the open form in which
//! clients read them (`wire`).
//!
//! Architecture invariant: nothing in this crate does I/O, reads the clock or draws random
//! numbers. Time, fresh ids and limits are passed in (`machine::Ctx`), so every rule is testable as data.

pub mod definition;
pub mod destination;
pub mod dispatch;
pub mod expr;
pub mod histogram;
pub mod ids;
pub mod labels;
pub mod limits;
pub mod machine;
pub mod model;
pub mod routing;
pub mod schedule;
pub mod scope;
pub mod text;
pub mod time;
pub mod trace;
pub mod webhook;
pub mod wire;

pub use definition::Workflow;
pub use ids::{JobId, TaskId};
pub use model::{Job, JobState, JobStatus, Task, TaskStatus};
pub use time::{Duration, Timestamp};
