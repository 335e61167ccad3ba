//! Tests of the parser: precedence, syntax errors and their columns, the
//! length and nesting limits, function arity, constant folding and the paths an
//! expression reads.

use proptest::prelude::*;
use serde_json::json;

use super::Node;
use crate::expr::tests::{
    check, check_ctx, check_parse_error, check_parse_error_at, check_refs, literal_context,
    valid_expression,
};
use crate::expr::{Expr, MAX_DEPTH, MAX_SOURCE_BYTES, Template, compile_condition};

#[test]
fn keywords_are_allowed_as_member_names() {
    check("a.null", json!({"a": {"null": 1}}), json!(1));
    check("a.in.true", json!({"a": {"in": {"true": 2}}}), json!(2));
}

#[test]
fn arithmetic_follows_precedence() {
    check("1 + 2 * 3", json!({}), json!(7));
    check("(1 + 2) * 3", json!({}), json!(9));
    check("10 - 4 - 3", json!({}), json!(3));
    check("2 * 3 + 4 * 5", json!({}), json!(26));
    check("8 / 2 / 2", json!({}), json!(2));
    check("1 + 2 * 3 - 4 / 2 * 3 + 1", json!({}), json!(2));
    check("1 < 2 == 2 < 3", json!({}), json!(true));
    check("false && false || true", json!({}), json!(true));
    check(
        "1 + 1 == 2 && 'a' + 'b' == 'ab' || false",
        json!({}),
        json!(true),
    );
    check("2 * 3 % 4", json!({}), json!(2));
    check("-2 * -3", json!({}), json!(6));
    check("- (2 + 3)", json!({}), json!(-5));
    check("--4", json!({}), json!(4));
    check("6 / 3", json!({}), json!(2));
    check("7 / 2", json!({}), json!(3.5));
    check("7 % 3", json!({}), json!(1));
    check("-7 % 3", json!({}), json!(-1));
    check("7.5 % 2", json!({}), json!(1.5));
    check("1.5 + 1", json!({}), json!(2.5));
    check("0.5 + 0.5", json!({}), json!(1.0));
    check_ctx("params.storage * 2", json!(40));
    check_ctx("params.storage - index", json!(18));
    check_ctx("params.ratio * 4", json!(2.0));
}

#[test]
fn syntax_errors_name_the_column() {
    check_parse_error_at("a + )", "unexpected ')'", 5);
    check_parse_error_at("1 +", "unexpected end of expression", 4);
    check_parse_error_at("(1 + 2", "expected ')', found end of expression", 7);
    check_parse_error_at("a b", "unexpected 'b'", 3);
    check_parse_error_at("a[1", "expected ']'", 4);
    check_parse_error_at("[1 2]", "expected ',' or ']'", 4);
    check_parse_error_at("len(1 2)", "expected ',' or ')'", 7);
    check_parse_error_at("a.1", "expected a name after '.'", 3);
    check_parse_error_at(
        "a.",
        "expected a name after '.', found end of expression",
        3,
    );
    check_parse_error_at("", "empty expression", 1);
    check_parse_error_at("   ", "empty expression", 1);
    check_parse_error_at("'é' + )", "unexpected ')'", 7);
    check_parse_error_at("a.b(1)", "unexpected '('", 4);
    check_parse_error_at("in", "unexpected 'in'", 1);
}

#[test]
fn unknown_functions_and_wrong_argument_counts_are_parse_errors() {
    check_parse_error_at("lenn(x)", "unknown function 'lenn'", 1);
    check_parse_error_at(
        "1 + len(1, 2)",
        "function 'len' expects 1 argument, got 2",
        5,
    );
    check_parse_error_at(
        "contains('a')",
        "function 'contains' expects 2 arguments, got 1",
        1,
    );
    check_parse_error_at(
        "format()",
        "function 'format' expects at least 1 argument, got 0",
        1,
    );
    check_parse_error_at("range()", "expects 1 argument, got 0", 1);
}

#[test]
fn deep_nesting_is_rejected_without_overflowing_the_stack() {
    let ok = format!("{}1{}", "(".repeat(60), ")".repeat(60));
    check(&ok, json!({}), json!(1));
    for src in [
        format!("{}1{}", "(".repeat(65), ")".repeat(65)),
        "(".repeat(4000),
        "!".repeat(4000),
        "-".repeat(4000),
        "[".repeat(4000),
        "a[".repeat(2000),
        "len(".repeat(1000),
        "!(".repeat(2000),
    ] {
        check_parse_error(&src, "nested too deeply");
    }
}

#[test]
fn deepest_accepted_expression_evaluates_without_overflowing_the_stack() {
    let levels = MAX_DEPTH - 1;
    let unit = "0 || 1 && 1 == 1 < 1 + 1 * -len([(";
    let src = format!("{}1{}", unit.repeat(levels / 4), ")])".repeat(levels / 4));
    let expr = Expr::parse(&src).unwrap_or_else(|e| panic!("{e}"));
    let _ = expr.eval(&json!({}));
    let _ = expr.references();
    assert_eq!(expr.clone(), expr);
    let too_deep = format!(
        "{}1{}",
        unit.repeat(levels / 4 + 1),
        ")])".repeat(levels / 4 + 1)
    );
    check_parse_error(&too_deep, "nested too deeply");
}

#[test]
fn overlong_sources_are_rejected() {
    let src = format!("'{}'", "x".repeat(MAX_SOURCE_BYTES));
    check_parse_error_at(&src, "expression is too long", 1);
    let src = format!("'{}'", "x".repeat(MAX_SOURCE_BYTES - 2));
    check(&src, json!({}), json!("x".repeat(MAX_SOURCE_BYTES - 2)));
}

#[test]
fn constant_parts_fold_to_their_value() {
    let same = |folded: &str, written: &str| {
        assert_eq!(
            Expr::parse(folded).unwrap(),
            Expr::parse(written).unwrap(),
            "{folded}"
        );
    };
    same("2 * 3", "6");
    same("params.n + 2 * 3", "params.n + 6");
    same("1 + 2 + params.n", "3 + params.n");
    same("'a' + 'b' + params.s", "'ab' + params.s");
    same("len(['a', 'b']) > params.n", "2 > params.n");
    same("[1, 2][-1] + params.n", "2 + params.n");
    same("params[lower('KEY')]", "params['key']");
    same("-(2 + 3)", "-5");
    same("!(1 == 1) || params.x", "false || params.x");
    same("default(null, 3)", "3");
    same("[1, params.n, 2 + 2]", "[1, params.n, 4]");
    check_refs("steps[lower('A')].output", &[&["steps", "a", "output"]]);
}

#[test]
fn constant_parts_that_cannot_be_evaluated_are_compile_errors() {
    check_parse_error_at("1 / 0", "division by zero", 3);
    check_parse_error_at("params.n + 1 / 0", "division by zero", 14);
    check_parse_error_at("'a' + 1 + params.n", "cannot add string and number", 5);
    check_parse_error_at("params.x || 1 % 0", "division by zero", 15);
    check_parse_error_at("false && 1 / 0", "division by zero", 12);
    check_parse_error_at("default(params.x, -'a')", "cannot negate string", 19);
    check_parse_error_at(
        "[1, len(2)]",
        "len: expected a string, list or object, got number",
        5,
    );
    check_parse_error_at("params[range(1000001)]", "result too large", 8);
    check_parse_error_at("1e308 * 10", "number out of range", 7);
    assert_eq!(
        Expr::parse("params.n + 1 / 0").unwrap_err().to_string(),
        "division by zero at column 14"
    );
    let error = Template::compile(&json!({"size_gb": "${{ params.n * (1 / 0) }}"})).unwrap_err();
    assert_eq!(
        error.to_string(),
        "in \"size_gb\": division by zero at column 19"
    );
    let error = compile_condition("${{ 'a' < 1 }}").unwrap_err();
    assert_eq!(
        (error.message.as_str(), error.column),
        ("cannot compare string and number", 9)
    );
}

#[test]
fn references_list_static_path_prefixes() {
    check_refs(
        "steps.check.output.hosts[0]",
        &[&["steps", "check", "output", "hosts"]],
    );
    check_refs("params[x]", &[&["params"], &["x"]]);
    check_refs("params['my key'].a", &[&["params", "my key", "a"]]);
    check_refs("params[x.y].z[w]", &[&["params"], &["x", "y"], &["w"]]);
    check_refs("a.b + a.b + c", &[&["a", "b"], &["c"]]);
    check_refs(
        "len(steps.make-db.output) > index",
        &[&["steps", "make-db", "output"], &["index"]],
    );
    check_refs("fromJSON(s).a", &[&["s"]]);
    check_refs("1 + 2", &[]);
    check_refs("default(a, [b, c[0]])", &[&["a"], &["b"], &["c"]]);
    check_refs("(p).q", &[&["p", "q"]]);
}

proptest! {
    #[test]
    fn folding_constants_keeps_every_result(
        [written, mixed, read] in valid_expression(),
    ) {
        let context = literal_context();
        let unfolded = Expr::parse(&read).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let at_run_time = unfolded.eval(&context);
        for source in [&written, &mixed] {
            if let Ok(folded) = Expr::parse(source) {
                prop_assert_eq!(folded.eval(&context), at_run_time.clone(), "{}", source);
            }
        }
        // With every leaf a literal the whole expression is constant: it folds to its
        // value (so, by the check above, one that fails at run time does not compile).
        if unfolded.references().iter().all(|path| path[0] == "v")
            && let Ok(folded) = Expr::parse(&written)
        {
            prop_assert!(matches!(folded.root, Node::Lit(_)), "{}: {:?}", written, folded);
        }
    }
}
