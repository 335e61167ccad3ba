// Starbridge web UI: live refresh of server-rendered sections, operator actions and job
// submission through the JSON API. No framework, no build step.
"use strict";
(function () {
  const main = document.getElementById("main");
  const namespace = document.body.dataset.namespace || "";
  const toast = document.getElementById("toast");
  const dialog = document.getElementById("act");

  function apiUrl(path) {
    if (!namespace) return path;
    return path + (path.includes("?") ? "&" : "?") + "namespace=" + encodeURIComponent(namespace);
  }

  function say(text, bad) {
    toast.textContent = text;
    toast.className = bad ? "bad" : "";
    clearTimeout(say.timer);
    say.timer = setTimeout(() => { toast.textContent = ""; }, bad ? 12000 : 4000);
  }

  // The API answers refusals with a problem document: show its detail.
  async function problemText(response) {
    try {
      const problem = await response.json();
      return problem.detail || problem.title || ("HTTP " + response.status);
    } catch (_) {
      return "HTTP " + response.status + " " + response.statusText;
    }
  }

  async function send(path, body, method) {
    const response = await fetch(apiUrl(path), {
      method: method || "POST",
      headers: { "Content-Type": "application/json", "Starbridge-Actor": "web-ui" },
      body: body === undefined ? "" : JSON.stringify(body),
    });
    if (!response.ok) throw new Error(await problemText(response));
    return response.status === 204 ? null : response.json();
  }

  // Re-reads this page and swaps in every section marked data-live whose content changed,
  // keeping open task panels, ticked rows and keyboard focus.
  let refreshing = false;
  let again = false;
  async function refresh() {
    if (refreshing) { again = true; return; }
    refreshing = true;
    try {
      const response = await fetch(location.href, { headers: { Accept: "text/html" } });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      const focused = document.activeElement && document.activeElement.id;
      for (const old of document.querySelectorAll("[data-live]")) {
        const next = fresh.getElementById(old.id);
        if (!next || next.outerHTML === old.outerHTML) continue;
        const open = new Set([...old.querySelectorAll("details[open]")].map((d) => d.id));
        const closed = new Set([...old.querySelectorAll("details:not([open])")].map((d) => d.id));
        for (const details of next.querySelectorAll("details")) {
          if (open.has(details.id)) details.open = true;
          if (closed.has(details.id)) details.open = false;
        }
        const ticked = new Set([...old.querySelectorAll("input[type=checkbox]:checked")].map((i) => i.id));
        for (const box of next.querySelectorAll("input[type=checkbox]")) {
          if (ticked.has(box.id)) box.setAttribute("checked", "");
        }
        for (const attribute of next.getAttributeNames()) {
          old.setAttribute(attribute, next.getAttribute(attribute));
        }
        old.innerHTML = next.innerHTML;
      }
      document.title = fresh.title;
      countSelected();
      if (focused && document.activeElement === document.body) {
        const element = document.getElementById(focused);
        if (element) element.focus();
      }
    } catch (_) {
      // The server may be restarting: the next change or tick tries again.
    } finally {
      refreshing = false;
      if (again) { again = false; refresh(); }
    }
  }

  if (main.dataset.stream) {
    const events = new EventSource(main.dataset.stream);
    events.addEventListener("change", refresh);
    events.addEventListener("open", refresh);
  } else if (main.dataset.refresh) {
    const every = Number(main.dataset.refresh);
    const tick = async () => {
      if (!document.hidden && !dialog.open) await refresh();
      setTimeout(tick, every);
    };
    setTimeout(tick, every);
  }

  // A node of the graph links to its step's section: open the step's task panels.
  function openTarget() {
    if (!location.hash) return;
    const target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (!target) return;
    for (const details of target.querySelectorAll("details")) details.open = true;
    if (target.tagName === "DETAILS") target.open = true;
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();

  // Operator actions: a button with data-url posts to the API (or sends data-method, and then
  // opens data-then); with data-confirm it asks first in a dialog that shows the fields named by
  // data-fields.
  let pending = null;
  function ask(button) {
    pending = button;
    const fields = (button.dataset.fields || "reason").split(" ");
    document.getElementById("act-title").textContent = button.textContent.replace("…", "");
    document.getElementById("act-text").textContent = button.dataset.confirm;
    document.getElementById("act-error").textContent = "";
    for (const field of dialog.querySelectorAll("[data-field]")) {
      field.hidden = !fields.includes(field.dataset.field);
    }
    const steps = document.getElementById("act-step");
    steps.replaceChildren();
    for (const step of (button.dataset.steps || "").split(" ").filter(Boolean)) {
      steps.append(new Option(step, step));
    }
    document.getElementById("act-reason").value = "";
    document.getElementById("act-comment").value = "";
    document.getElementById("act-step-name").value = "";
    document.getElementById("act-message").value = "";
    document.getElementById("act-compensate").checked = false;
    dialog.showModal();
    const first = dialog.querySelector("[data-field]:not([hidden]) textarea, [data-field]:not([hidden]) select, [data-field]:not([hidden]) input");
    if (first) first.focus();
  }

  async function run(button, body) {
    button.disabled = true;
    try {
      const answer = await send(button.dataset.url, body, button.dataset.method);
      if (button === bulkButton) showBulkResult(answer);
      if (button.dataset.then) {
        // What the button acted on is gone (a deleted job): go where it says.
        location.assign(button.dataset.then);
        return null;
      }
      say(button.dataset.done || "Done");
      await refresh();
      return null;
    } catch (error) {
      return error.message;
    } finally {
      button.disabled = false;
    }
  }

  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button[data-url]");
    // The bulk button asks only after counting the jobs (see below).
    if (!button || button === bulkButton) return;
    if (button.dataset.confirm) { ask(button); return; }
    const refused = await run(button);
    if (refused) say("Refused: " + refused, true);
  });

  document.getElementById("act-cancel").addEventListener("click", () => dialog.close());
  dialog.querySelector("form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = pending;
    if (!button) return;
    const fields = (button.dataset.fields || "reason").split(" ");
    let body = {};
    const reason = document.getElementById("act-reason").value.trim();
    if (reason) body.reason = reason;
    if (fields.includes("compensate")) body.compensate = document.getElementById("act-compensate").checked;
    if (fields.includes("step")) body.step = document.getElementById("act-step").value;
    if (fields.includes("step-name")) body.step = document.getElementById("act-step-name").value.trim();
    if (fields.includes("error")) body.error = document.getElementById("act-message").value.trim();
    if (button === bulkButton) body = Object.assign({}, bulkSelection, body);
    if (fields.includes("comment")) {
      const comment = document.getElementById("act-comment").value.trim();
      if (comment) body.comment = comment;
    }
    if (fields.includes("output")) {
      const text = document.getElementById("act-output").value.trim();
      try {
        body.output = text ? JSON.parse(text) : null;
      } catch (error) {
        document.getElementById("act-error").textContent = "The output is not JSON: " + error.message;
        return;
      }
    }
    const ok = document.getElementById("act-ok");
    ok.disabled = true;
    const refused = await run(button, body);
    ok.disabled = false;
    if (refused) {
      document.getElementById("act-error").textContent = "Refused: " + refused;
    } else {
      dialog.close();
    }
  });

  // Bulk actions on the job list: the ticked rows (by id) or every job the filter matches (the
  // filter as the bulk API takes it, rendered by the server), counted first by a dry run that the
  // dialog shows; what the action did is shown under the bar.
  const bulk = document.getElementById("bulk");
  const bulkButton = document.getElementById("bulk-go");
  let bulkSelection = null;
  const BULK_FIELDS = {
    pause: "reason", resume: "reason", retry: "reason", delete: "reason",
    cancel: "compensate reason", rerun: "step-name reason", skip: "step-name output reason",
  };

  function ticked() {
    return [...document.querySelectorAll("#jobs input.pick:checked")].map((box) => box.value);
  }

  function countSelected() {
    if (!bulk) return;
    const boxes = document.querySelectorAll("#jobs input.pick");
    const count = ticked().length;
    document.getElementById("bulk-count").textContent = count + " selected";
    const all = document.getElementById("select-page");
    all.checked = boxes.length > 0 && count === boxes.length;
    all.indeterminate = count > 0 && count < boxes.length;
  }

  function showBulkResult(answer) {
    const result = document.getElementById("bulk-result");
    const refused = answer.matched - answer.affected;
    const line = document.createElement("p");
    const number = (id, value) => {
      const b = document.createElement("b");
      b.id = id;
      b.textContent = String(value);
      return b;
    };
    line.append(bulkButton.dataset.label + ": ", number("bulk-matched", answer.matched), " matched, ",
      number("bulk-affected", answer.affected), " affected, ", number("bulk-refused", refused), " refused.");
    const list = document.createElement("ul");
    for (const refusal of answer.refused) {
      const item = document.createElement("li");
      const link = document.createElement("a");
      link.className = "mono";
      link.href = "/ui/jobs/" + encodeURIComponent(refusal.id) +
        (namespace ? "?namespace=" + encodeURIComponent(namespace) : "");
      link.textContent = refusal.id;
      item.append(link, ": " + refusal.reason);
      list.append(item);
    }
    result.replaceChildren(line);
    if (answer.refused.length) result.append(list);
    for (const box of document.querySelectorAll("#jobs input.pick:checked")) box.checked = false;
    countSelected();
  }

  if (bulk) {
    document.addEventListener("change", (event) => {
      if (event.target.id === "select-page") {
        for (const box of document.querySelectorAll("#jobs input.pick")) box.checked = event.target.checked;
      }
      if (event.target.matches("#select-page, #jobs input.pick")) countSelected();
    });
    bulkButton.addEventListener("click", async () => {
      const action = document.getElementById("bulk-action");
      const whole = document.getElementById("bulk-scope").value === "filter";
      const ids = ticked();
      if (!whole && ids.length === 0) {
        say("Select rows first, or choose all matching the filter", true);
        return;
      }
      const selection = whole ? JSON.parse(bulk.dataset.filter) : { ids };
      const url = "/api/v1/jobs/bulk/" + action.value;
      let counted;
      try {
        counted = await send(url, Object.assign({}, selection, { dry_run: true }));
      } catch (error) {
        say("Refused: " + error.message, true);
        return;
      }
      bulkSelection = selection;
      bulkButton.dataset.url = url;
      bulkButton.dataset.fields = BULK_FIELDS[action.value];
      bulkButton.dataset.label = action.selectedOptions[0].textContent;
      bulkButton.dataset.done = bulkButton.dataset.label + ": done";
      bulkButton.dataset.confirm = "";
      ask(bulkButton);
      document.getElementById("act-title").textContent = bulkButton.dataset.label;
      const text = document.getElementById("act-text");
      const matched = document.createElement("b");
      matched.id = "act-matched";
      matched.textContent = String(counted.matched);
      const which = whole ? "every job the filter matches" : "the selected rows";
      const more = whole && counted.matched >= Number(bulk.dataset.max)
        ? " (the most one action takes: more may match)" : "";
      text.replaceChildren(bulkButton.dataset.label + ": ", matched, " jobs, " + which + more +
        ". Each job it does not apply to is refused and listed.");
    });
    countSelected();
  }

  // Submitting a job from a workflow page: fields generated from the params schema.
  const submit = document.getElementById("submit-job");
  if (submit) {
    submit.addEventListener("submit", async (event) => {
      event.preventDefault();
      const error = document.getElementById("submit-error");
      error.textContent = "";
      let params = {};
      const extra = submit.querySelector("[data-params-json]").value.trim();
      if (extra) {
        try {
          params = JSON.parse(extra);
        } catch (e) {
          error.textContent = "Params (JSON) is not JSON: " + e.message;
          return;
        }
      }
      for (const input of submit.querySelectorAll("[data-param]")) {
        const name = input.dataset.param;
        const type = input.dataset.type;
        if (type === "boolean") { params[name] = input.checked; continue; }
        if (input.value === "") continue;
        if (input.tagName === "SELECT") {
          params[name] = JSON.parse(input.selectedOptions[0].dataset.json);
        } else if (type === "integer" || type === "number") {
          params[name] = Number(input.value);
        } else if (type === "object" || type === "array") {
          try {
            params[name] = JSON.parse(input.value);
          } catch (e) {
            error.textContent = name + " is not JSON: " + e.message;
            return;
          }
        } else {
          params[name] = input.value;
        }
      }
      const request = {
        workflow: submit.dataset.workflow,
        version: Number(submit.dataset.version),
        params,
      };
      const key = document.getElementById("submit-key").value.trim();
      if (key) request.key = key;
      try {
        const job = await send("/api/v1/jobs", request);
        location.href = "/ui/jobs/" + encodeURIComponent(job.id) +
          (namespace ? "?namespace=" + encodeURIComponent(namespace) : "");
      } catch (e) {
        error.textContent = "Refused: " + e.message;
      }
    });
  }
})();
