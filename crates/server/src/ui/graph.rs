//! The DAG of a workflow or a job as data, and its two drawings: SVG (laid out by `layout`) and
//! Graphviz DOT. A job's graph colours each step by the state of its tasks, collapses a fan-out
//! step's items into one node with counts, and shows compensation on the step it undoes. Pure.

use std::fmt::Write as _;

use starbridge_api::TaskView;
use starbridge_core::definition::{SleepSpec, StepKind, WaitStep, Workflow};
use starbridge_core::model::{TaskKind, TaskStatus};

use super::html::{Esc, url};
use super::layout::{NODE_HEIGHT, NODE_WIDTH, layout};

/// What the graph shows for a step of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeState {
    Waiting,
    Ready,
    Running,
    Succeeded,
    Failed,
    Skipped,
    Cancelled,
    Compensating,
    Compensated,
    CompensationFailed,
}

impl NodeState {
    /// Every state, in the legend's order.
    pub(crate) const ALL: [NodeState; 10] = [
        NodeState::Succeeded,
        NodeState::Running,
        NodeState::Ready,
        NodeState::Waiting,
        NodeState::Failed,
        NodeState::Skipped,
        NodeState::Cancelled,
        NodeState::Compensating,
        NodeState::Compensated,
        NodeState::CompensationFailed,
    ];

    /// The CSS class suffix and the word shown on the node.
    pub(crate) fn name(self) -> &'static str {
        match self {
            NodeState::Waiting => "waiting",
            NodeState::Ready => "ready",
            NodeState::Running => "running",
            NodeState::Succeeded => "succeeded",
            NodeState::Failed => "failed",
            NodeState::Skipped => "skipped",
            NodeState::Cancelled => "cancelled",
            NodeState::Compensating => "compensating",
            NodeState::Compensated => "compensated",
            NodeState::CompensationFailed => "compensation_failed",
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            NodeState::CompensationFailed => "compensation failed",
            other => other.name(),
        }
    }

    /// Fill and border colours (also used by the DOT export).
    fn colours(self) -> (&'static str, &'static str) {
        match self {
            NodeState::Waiting => ("#f1f3f5", "#868e96"),
            NodeState::Ready => ("#e7f0ff", "#4c6ef5"),
            NodeState::Running => ("#fff3bf", "#e67700"),
            NodeState::Succeeded => ("#d3f9d8", "#2b8a3e"),
            NodeState::Failed => ("#ffe3e3", "#c92a2a"),
            NodeState::Skipped => ("#ffffff", "#adb5bd"),
            NodeState::Cancelled => ("#e9ecef", "#495057"),
            NodeState::Compensating => ("#f3d9fa", "#9c36b5"),
            NodeState::Compensated => ("#e5dbff", "#5f3dc4"),
            NodeState::CompensationFailed => ("#ffc9c9", "#862e9c"),
        }
    }

    fn from_task(status: TaskStatus) -> NodeState {
        match status {
            TaskStatus::Waiting => NodeState::Waiting,
            TaskStatus::Ready => NodeState::Ready,
            TaskStatus::Running => NodeState::Running,
            TaskStatus::Succeeded => NodeState::Succeeded,
            TaskStatus::Failed => NodeState::Failed,
            TaskStatus::Skipped => NodeState::Skipped,
            TaskStatus::Cancelled => NodeState::Cancelled,
        }
    }
}

/// The style rules for node states, shared by the page, the legend and downloaded SVGs.
pub(crate) fn state_styles() -> String {
    let mut css = String::from(
        ".sb-graph text{font:13px system-ui,sans-serif;fill:#212529}\
         .sb-graph .detail,.sb-graph .state{font-size:11px;fill:#495057}\
         .sb-graph .name{font-weight:600}.sb-graph .state{font-weight:600;text-transform:uppercase;letter-spacing:.04em}\
         .sb-graph .edge{fill:none;stroke:#868e96;stroke-width:1.5}\
         .sb-graph rect.box{fill:#fff;stroke:#495057;stroke-width:1.5}\
         .sb-graph .st-running rect.box{stroke-width:3}\
         .sb-graph .st-skipped rect.box{stroke-dasharray:5 3}\
         .sb-graph a:focus rect.box{stroke:#1c7ed6;stroke-width:4}",
    );
    for state in NodeState::ALL {
        let (fill, stroke) = state.colours();
        let _ = write!(
            css,
            ".st-{} rect.box,.st-{} rect.swatch{{fill:{fill};stroke:{stroke}}}",
            state.name(),
            state.name()
        );
    }
    css
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    /// The step id.
    pub(crate) id: String,
    /// A second line: queue and command, or a fan-out's counts.
    pub(crate) detail: String,
    pub(crate) state: Option<NodeState>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Graph {
    pub(crate) name: String,
    pub(crate) nodes: Vec<Node>,
    pub(crate) edges: Vec<(usize, usize)>,
}

fn step_detail(workflow: &Workflow, index: usize) -> String {
    let step = &workflow.steps[index];
    let fan_out = if step.for_each.is_some() {
        "for each · "
    } else {
        ""
    };
    let what = match &step.kind {
        StepKind::Task(handler) => {
            let command = handler.command.lines().next().unwrap_or("");
            format!("{} · {command}", handler.queue.source())
        }
        StepKind::Wait(WaitStep::Sleep(SleepSpec::For(duration))) => format!("sleep {duration}"),
        StepKind::Wait(WaitStep::Sleep(SleepSpec::Until(_))) => "sleep until a time".to_owned(),
        StepKind::Wait(WaitStep::Signal(name)) => format!("signal {name}"),
        StepKind::Wait(WaitStep::Approval { .. }) => "approval".to_owned(),
        StepKind::Set(_) => "set".to_owned(),
        StepKind::Fail { .. } => "fail the job".to_owned(),
        StepKind::Workflow(child) => format!("workflow {}", child.workflow),
    };
    format!("{fan_out}{what}")
}

fn edges_of(workflow: &Workflow) -> Vec<(usize, usize)> {
    workflow
        .steps
        .iter()
        .enumerate()
        .flat_map(|(to, step)| step.depends_on.iter().map(move |&from| (from, to)))
        .collect()
}

/// A workflow's steps and dependencies, without states.
pub(crate) fn workflow_graph(workflow: &Workflow) -> Graph {
    Graph {
        name: workflow.name.clone(),
        nodes: (0..workflow.steps.len())
            .map(|index| Node {
                id: workflow.steps[index].id.clone(),
                detail: step_detail(workflow, index),
                state: None,
            })
            .collect(),
        edges: edges_of(workflow),
    }
}

fn status(task: &TaskView) -> Option<TaskStatus> {
    task.status.known()
}

/// `attempt 2/3`; past the step's budget (an operator's retry gives a fresh one) only the number.
pub(crate) fn attempts(attempt: u32, max: u32) -> String {
    if attempt <= max {
        format!("attempt {attempt}/{max}")
    } else {
        format!("attempt {attempt}")
    }
}

/// The state and detail line of one step from its tasks.
fn step_state(step: &str, tasks: &[TaskView], fallback: String) -> (Option<NodeState>, String) {
    let of_step = |kind: TaskKind| {
        tasks
            .iter()
            .filter(move |t| t.step == step && t.kind == kind)
    };
    let main = of_step(TaskKind::Step)
        .chain(of_step(TaskKind::FanOut))
        .next_back();
    let Some(main) = main else {
        return (None, fallback);
    };
    let mut state = status(main).map(NodeState::from_task);
    let mut detail = fallback;
    if main.kind == TaskKind::FanOut {
        let items: Vec<TaskStatus> = of_step(TaskKind::Item).filter_map(status).collect();
        let count = |wanted: TaskStatus| items.iter().filter(|&&s| s == wanted).count();
        let done = count(TaskStatus::Succeeded) + count(TaskStatus::Skipped);
        let mut parts = vec![format!("{done}/{} items done", items.len())];
        for (wanted, word) in [
            (TaskStatus::Running, "running"),
            (TaskStatus::Failed, "failed"),
        ] {
            if count(wanted) > 0 {
                parts.push(format!("{} {word}", count(wanted)));
            }
        }
        detail = parts.join(" · ");
    } else if main.attempt > 1 || main.max_attempts > 1 && main.attempt > 0 {
        detail = attempts(main.attempt, main.max_attempts);
    }
    // A compensation made after the task last ended tells what happened to its effect.
    if let Some(undo) = of_step(TaskKind::Compensation).next_back() {
        let after_end = main.ended_at.is_some_and(|ended| undo.created_at >= ended);
        if after_end {
            state = match status(undo) {
                Some(TaskStatus::Succeeded | TaskStatus::Skipped) => Some(NodeState::Compensated),
                Some(TaskStatus::Failed) => Some(NodeState::CompensationFailed),
                Some(TaskStatus::Cancelled) | None => state,
                Some(_) => Some(NodeState::Compensating),
            };
        }
    }
    (state, detail)
}

/// A job's graph: the workflow's steps coloured by their tasks' states. Without the workflow
/// (it could not be loaded), one node per step seen among the tasks.
pub(crate) fn job_graph(workflow: Option<&Workflow>, tasks: &[TaskView], name: &str) -> Graph {
    // Each step's id and its default detail line.
    let steps: Vec<(String, String)>;
    let edges: Vec<(usize, usize)>;
    (steps, edges) = match workflow {
        Some(workflow) => (
            (0..workflow.steps.len())
                .map(|i| (workflow.steps[i].id.clone(), step_detail(workflow, i)))
                .collect(),
            edges_of(workflow),
        ),
        None => {
            let mut seen: Vec<(String, String)> = Vec::new();
            for task in tasks {
                if !seen.iter().any(|(id, _)| *id == task.step) {
                    seen.push((
                        task.step.clone(),
                        format!("{} · {}", task.queue, task.command),
                    ));
                }
            }
            (seen, Vec::new())
        }
    };
    Graph {
        name: name.to_owned(),
        nodes: steps
            .into_iter()
            .map(|(id, fallback)| {
                let (state, detail) = step_state(&id, tasks, fallback);
                Node { id, detail, state }
            })
            .collect(),
        edges,
    }
}

fn shorten(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_owned()
    } else {
        let cut: String = text.chars().take(chars - 1).collect();
        format!("{cut}…")
    }
}

/// Draws the graph. `link` gives each node's link target (a step anchor on a job page).
pub(crate) fn svg(graph: &Graph, link: Option<&dyn Fn(&Node) -> String>) -> String {
    let placed = layout(graph.nodes.len(), &graph.edges);
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" class="sb-graph" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="group" aria-label="{label}"><style>{style}</style><defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z" fill="#868e96"/></marker></defs>"##,
        w = placed.width,
        h = placed.height,
        label = Esc(&format!("graph of {}", graph.name)),
        style = state_styles(),
    );
    for route in &placed.routes {
        let Some(&(x0, y0)) = route.first() else {
            continue;
        };
        let mut d = format!("M{x0} {y0}");
        for pair in route.windows(2) {
            let ((ax, ay), (bx, by)) = (pair[0], pair[1]);
            if ay == by {
                let _ = write!(d, "L{bx} {by}");
            } else {
                let mid = (ax + bx) / 2.0;
                let _ = write!(d, "C{mid} {ay} {mid} {by} {bx} {by}");
            }
        }
        let _ = write!(
            out,
            r#"<path class="edge" d="{d}" marker-end="url(#arrow)"/>"#
        );
    }
    for (node, &(x, y)) in graph.nodes.iter().zip(&placed.positions) {
        let state = node.state.map_or("", NodeState::label);
        let class = node
            .state
            .map_or_else(|| "node".to_owned(), |s| format!("node st-{}", s.name()));
        let description = if state.is_empty() {
            format!("step {}: {}", node.id, node.detail)
        } else {
            format!("step {}: {state}, {}", node.id, node.detail)
        };
        let _ = write!(
            out,
            r#"<g class="{class}" data-step="{id}" data-state="{state_attr}">"#,
            id = Esc(&node.id),
            state_attr = node.state.map_or("", NodeState::name),
        );
        if let Some(link) = link {
            let _ = write!(
                out,
                r#"<a href="{}" aria-label="{}">"#,
                Esc(&link(node)),
                Esc(&description)
            );
        }
        let _ = write!(
            out,
            r#"<title>{}</title><rect class="box" x="{x}" y="{y}" width="{NODE_WIDTH}" height="{NODE_HEIGHT}" rx="7"/><text class="name" x="{tx}" y="{t1}">{title}</text>"#,
            Esc(&description),
            tx = x + 10.0,
            t1 = y + 20.0,
            title = Esc(&shorten(&node.id, 22)),
        );
        let detail_y = if state.is_empty() {
            y + 42.0
        } else {
            let _ = write!(
                out,
                r#"<text class="state" x="{tx}" y="{ty}">{state}</text>"#,
                tx = x + 10.0,
                ty = y + 37.0,
            );
            y + 53.0
        };
        let _ = write!(
            out,
            r#"<text class="detail" x="{tx}" y="{detail_y}">{detail}</text>"#,
            tx = x + 10.0,
            detail = Esc(&shorten(&node.detail, 28)),
        );
        if link.is_some() {
            out.push_str("</a>");
        }
        out.push_str("</g>");
    }
    out.push_str("</svg>");
    out
}

/// The state legend: a swatch and the state's name for each state.
pub(crate) fn legend() -> String {
    let mut out = String::from(r#"<ul class="legend" aria-label="task states">"#);
    for state in NodeState::ALL {
        let _ = write!(
            out,
            r#"<li class="st-{}"><svg class="sb-graph" width="14" height="14" aria-hidden="true"><rect class="swatch" x="1" y="1" width="12" height="12" rx="3" stroke-width="1.5"/></svg>{}</li>"#,
            state.name(),
            state.label()
        );
    }
    out.push_str("</ul>");
    out
}

fn dot_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The graph in Graphviz DOT, left to right, states as labels and fill colours.
pub(crate) fn dot(graph: &Graph) -> String {
    let mut out = format!(
        "digraph {} {{\n  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", fontname=\"Helvetica\"];\n",
        dot_string(&graph.name)
    );
    for node in &graph.nodes {
        let mut label = format!("{}\n{}", node.id, shorten(&node.detail, 40));
        let mut colours = String::new();
        if let Some(state) = node.state {
            label.push('\n');
            label.push_str(state.label());
            let (fill, stroke) = state.colours();
            colours = format!(", fillcolor=\"{fill}\", color=\"{stroke}\"");
        }
        let _ = writeln!(
            out,
            "  {} [label={}{colours}];",
            dot_string(&node.id),
            dot_string(&label)
        );
    }
    for &(from, to) in &graph.edges {
        if let (Some(a), Some(b)) = (graph.nodes.get(from), graph.nodes.get(to)) {
            let _ = writeln!(out, "  {} -> {};", dot_string(&a.id), dot_string(&b.id));
        }
    }
    out.push_str("}\n");
    out
}

/// A node's anchor on the job page.
pub(crate) fn step_anchor(node: &Node) -> String {
    format!("#step-{}", url(&node.id))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn workflow() -> Workflow {
        Workflow::from_value(
            "provision",
            json!({"steps": [
                {"id": "reserve", "queue": "q", "command": "reserve",
                 "compensate": {"queue": "q", "command": "release"}},
                {"id": "configure", "queue": "q", "command": "cfg", "for_each": "${{ params.items }}"},
                {"id": "load", "queue": "q", "command": "load"},
            ]}),
        )
        .unwrap()
    }

    fn task(step: &str, kind: &str, status: &str) -> TaskView {
        serde_json::from_value(json!({
            "id": format!("tsk_{step}_{kind}"), "step": step, "kind": kind, "item": null,
            "compensates": null, "queue": "q", "command": "c", "status": status, "attempt": 1,
            "max_attempts": 1, "priority": 0, "input": null, "output": null, "error": null,
            "progress": null, "logs": null, "worker_id": null,
            "created_at": "2026-11-23T01:00:00Z", "ready_at": null, "available_at": null,
            "started_at": null, "ended_at": "2026-11-23T01:00:01Z", "lease_expires_at": null,
            "deadline_at": null, "attempts": [], "waiting_reason": null
        }))
        .unwrap()
    }

    fn states(graph: &Graph) -> Vec<(&str, Option<&str>, &str)> {
        graph
            .nodes
            .iter()
            .map(|n| {
                (
                    n.id.as_str(),
                    n.state.map(NodeState::name),
                    n.detail.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn a_workflow_graph_has_a_node_per_step_and_its_dependencies() {
        let graph = workflow_graph(&workflow());
        assert_eq!(
            states(&graph),
            [
                ("reserve", None, "q · reserve"),
                ("configure", None, "for each · q · cfg"),
                ("load", None, "q · load"),
            ]
        );
        assert_eq!(graph.edges, [(0, 1), (1, 2)]);
    }

    #[test]
    fn attempts_beyond_the_budget_show_only_their_number() {
        assert_eq!(attempts(2, 3), "attempt 2/3");
        assert_eq!(attempts(2, 1), "attempt 2");
    }

    #[test]
    fn a_fan_out_is_one_node_with_item_counts() {
        let tasks = [
            task("reserve", "step", "succeeded"),
            task("configure", "fan_out", "running"),
            task("configure", "item", "succeeded"),
            task("configure", "item", "running"),
            task("configure", "item", "failed"),
            task("load", "step", "waiting"),
        ];
        let graph = job_graph(Some(&workflow()), &tasks, "job");
        assert_eq!(
            states(&graph),
            [
                ("reserve", Some("succeeded"), "q · reserve"),
                (
                    "configure",
                    Some("running"),
                    "1/3 items done · 1 running · 1 failed"
                ),
                ("load", Some("waiting"), "q · load"),
            ]
        );
    }

    #[test]
    fn a_compensation_after_the_task_ended_shows_on_its_step() {
        let workflow = workflow();
        for (undo, expected) in [
            ("running", "compensating"),
            ("ready", "compensating"),
            ("succeeded", "compensated"),
            ("failed", "compensation_failed"),
        ] {
            let mut compensation = task("reserve", "compensation", undo);
            compensation.created_at = "2026-11-23T01:00:05Z".parse().unwrap();
            let tasks = [task("reserve", "step", "succeeded"), compensation];
            let graph = job_graph(Some(&workflow), &tasks, "job");
            assert_eq!(graph.nodes[0].state.map(NodeState::name), Some(expected));
        }
        // A task run again after its compensation shows its own state.
        let mut rerun = task("reserve", "step", "running");
        rerun.ended_at = None;
        let tasks = [rerun, task("reserve", "compensation", "succeeded")];
        let graph = job_graph(Some(&workflow), &tasks, "job");
        assert_eq!(graph.nodes[0].state, Some(NodeState::Running));
    }

    #[test]
    fn svg_names_each_state_in_text_and_class_and_escapes_ids() {
        let graph = Graph {
            name: "g<1>".to_owned(),
            nodes: vec![Node {
                id: "a&b".to_owned(),
                detail: "q".to_owned(),
                state: Some(NodeState::Failed),
            }],
            edges: Vec::new(),
        };
        let drawn = svg(&graph, Some(&step_anchor));
        assert!(drawn.contains(r#"class="node st-failed""#), "{drawn}");
        assert!(drawn.contains(">failed</text>"));
        assert!(drawn.contains("a&amp;b"));
        assert!(drawn.contains(r##"href="#step-a%26b""##));
        assert!(!drawn.contains("g<1>"));
    }

    #[test]
    fn dot_lists_nodes_with_states_and_edges() {
        let mut graph = workflow_graph(&workflow());
        graph.nodes[2].state = Some(NodeState::Failed);
        graph.nodes[0].id = "say \"hi\"".to_owned();
        let text = dot(&graph);
        assert!(text.starts_with("digraph \"provision\" {\n  rankdir=LR;"));
        assert!(text.contains(
            "  \"load\" [label=\"load\\nq · load\\nfailed\", fillcolor=\"#ffe3e3\", color=\"#c92a2a\"];"
        ));
        assert!(text.contains("  \"say \\\"hi\\\"\" -> \"configure\";"));
        assert!(text.contains("  \"configure\" -> \"load\";"));
    }
}
