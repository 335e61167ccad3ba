//! The "submit a job" form generated from a workflow's params JSON Schema: one labelled field
//! per top-level property (a choice for an `enum`, a checkbox for a boolean, a number field for
//! numbers, JSON text for objects and lists), plus a JSON box for anything else. The page's
//! script turns the fields back into a params object. Pure.

use std::fmt::Write as _;

use serde_json::Value;

use super::html::{Esc, json};

fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The form's fields for `schema` (none: a workflow without a params schema).
pub(crate) fn fields(schema: Option<&Value>) -> String {
    let mut out = String::new();
    let properties = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object);
    let required: Vec<&str> = schema
        .and_then(|s| s.get("required"))
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, property) in properties.into_iter().flatten() {
        let kind = property.get("type").and_then(Value::as_str).unwrap_or("");
        let is_required = required.contains(&name.as_str());
        let id = format!("param-{name}");
        let help = property
            .get("description")
            .or_else(|| property.get("title"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let default = property.get("default");
        let attributes = format!(
            r#"id="{id}" name="{name}" data-param="{name}" data-type="{kind}"{req}"#,
            id = Esc(&id),
            name = Esc(name),
            kind = Esc(kind),
            req = if is_required { " required" } else { "" },
        );
        let check = if kind == "boolean" && property.get("enum").is_none() {
            " check"
        } else {
            ""
        };
        let _ = write!(
            out,
            r#"<div class="field{check}"><label for="{}">{}{}</label>"#,
            Esc(&id),
            Esc(name),
            if is_required {
                r#" <span class="required">(required)</span>"#
            } else {
                ""
            }
        );
        if let Some(choices) = property.get("enum").and_then(Value::as_array) {
            let _ = write!(out, "<select {attributes}>");
            if !is_required {
                out.push_str(r#"<option value="">(not set)</option>"#);
            }
            for choice in choices {
                let text = text_of(choice);
                let selected = if default == Some(choice) {
                    " selected"
                } else {
                    ""
                };
                let _ = write!(
                    out,
                    r#"<option value="{}" data-json="{}"{selected}>{}</option>"#,
                    Esc(&text),
                    Esc(&choice.to_string()),
                    Esc(&text)
                );
            }
            out.push_str("</select>");
        } else {
            match kind {
                "boolean" => {
                    let checked = if default == Some(&Value::Bool(true)) {
                        " checked"
                    } else {
                        ""
                    };
                    let _ = write!(out, r#"<input type="checkbox" {attributes}{checked}>"#);
                }
                "integer" | "number" => {
                    let step = if kind == "integer" { "1" } else { "any" };
                    let value = default.map(text_of).unwrap_or_default();
                    let _ = write!(
                        out,
                        r#"<input type="number" step="{step}" value="{}" {attributes}>"#,
                        Esc(&value)
                    );
                }
                "object" | "array" => {
                    let value = default.map(json).unwrap_or_default();
                    let _ = write!(
                        out,
                        r#"<textarea rows="3" spellcheck="false" {attributes}>{}</textarea>"#,
                        Esc(&value)
                    );
                }
                _ => {
                    let value = default.map(text_of).unwrap_or_default();
                    let _ = write!(
                        out,
                        r#"<input type="text" value="{}" {attributes}>"#,
                        Esc(&value)
                    );
                }
            }
        }
        if !help.is_empty() {
            let _ = write!(out, r#"<small class="help">{}</small>"#, Esc(help));
        }
        out.push_str("</div>");
    }
    let other = if properties.is_some() {
        "Other params (JSON object, merged with the fields above)"
    } else {
        "Params (JSON object)"
    };
    let _ = write!(
        out,
        r#"<div class="field"><label for="params-json">{other}</label><textarea id="params-json" rows="4" spellcheck="false" data-params-json>{{}}</textarea></div>"#
    );
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_property_gets_a_labelled_field_of_its_type() {
        let schema = json!({
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "description": "database <name>"},
                "size_gb": {"type": "integer", "default": 20},
                "engine": {"enum": ["mysql", "postgres"], "default": "postgres"},
                "replica": {"type": "boolean", "default": true},
                "tags": {"type": "array"}
            }
        });
        let form = fields(Some(&schema));
        assert!(
            form.contains(
                r#"<label for="param-name">name <span class="required">(required)</span></label>"#
            ),
            "{form}"
        );
        assert!(form.contains(r#"<input type="text" value="" id="param-name" name="name" data-param="name" data-type="string" required>"#));
        assert!(form.contains("database &lt;name&gt;"));
        assert!(form.contains(r#"<input type="number" step="1" value="20" id="param-size_gb""#));
        assert!(
            form.contains(r#"<option value="postgres" data-json="&quot;postgres&quot;" selected>"#)
        );
        assert!(form.contains(r#"<input type="checkbox" id="param-replica" name="replica" data-param="replica" data-type="boolean" checked>"#));
        assert!(form.contains(r#"<textarea rows="3" spellcheck="false" id="param-tags""#));
        assert!(form.contains("Other params (JSON object"));
    }

    #[test]
    fn without_a_schema_the_form_is_one_json_box() {
        let form = fields(None);
        assert!(!form.contains("data-param="));
        assert!(form.contains(r#"<label for="params-json">Params (JSON object)</label>"#));
    }
}
