//! Tests of the evaluator: paths, operators, numbers, truthiness, membership,
//! type errors and the size limit of results.

use serde_json::json;

use crate::expr::tests::{check, check_ctx, check_eval_error, check_eval_error_in, context};
use crate::expr::{EvalError, Expr, truthy};

#[test]
fn integers_stay_integers() {
    let value = Expr::parse("1 + 2").unwrap().eval(&json!({})).unwrap();
    assert!(value.is_i64(), "{value:?}");
    assert_eq!(value.to_string(), "3");
}

#[test]
fn paths_read_from_the_context() {
    check_ctx("params.storage", json!(20));
    check_ctx("params.env", json!("prod"));
    check_ctx("params", context()["params"].clone());
    check_ctx("steps.check.output.hosts[0]", json!("h1"));
    check_ctx("steps.check.output.hosts[-1]", json!("h3"));
    check_ctx("steps.check.output.hosts[-3]", json!("h1"));
    check_ctx("steps.check.output.hosts[index]", json!("h3"));
    check_ctx("steps.check.output.hosts[1.0]", json!("h2"));
    check_ctx("params['my key']", json!("spaced"));
    check_ctx("params[params.which]", json!("prod"));
    check_ctx("params.nested.x.y[1]", json!(20));
    check_ctx("params['nested']['x'].y[2]", json!(30));
    check_ctx("(params.nested).x.y[0]", json!(10));
    check_ctx("steps.make-db.output.id", json!("db-1"));
    check_ctx("fromJSON('{\"a\": [5, 6]}').a[1]", json!(6));
    check_ctx("[7, 8, 9][1]", json!(8));
}

#[test]
fn missing_path_reads_as_null() {
    check_ctx("params.missing", json!(null));
    check_ctx("params.missing.deeper[3]", json!(null));
    check_ctx("nothing", json!(null));
    check_ctx("nothing.at.all", json!(null));
    check_ctx("steps.check.output.hosts[3]", json!(null));
    check_ctx("steps.check.output.hosts[-4]", json!(null));
    check_ctx("steps.check.output.hosts[0.5]", json!(null));
    check_ctx("steps.check.output.hosts['0']", json!(null));
    check_ctx("params.env.length", json!(null));
    check_ctx("params.storage[0]", json!(null));
    check_ctx("params[null]", json!(null));
    check_ctx("params[true]", json!(null));
    check_ctx("'abc'[0]", json!(null));
    check("anything", json!([1, 2]), json!(null));
    check("anything", json!(null), json!(null));
}

#[test]
fn integer_overflow_falls_back_to_float() {
    check(
        "9223372036854775807 + 1",
        json!({}),
        json!(9223372036854775808u64),
    );
    check(
        "18446744073709551615 + 1",
        json!({}),
        json!(18446744073709551616.0),
    );
    check(
        "-9223372036854775808 - 1",
        json!({}),
        json!(-9223372036854775809.0),
    );
    check(
        "9223372036854775807 * 9223372036854775807",
        json!({}),
        json!(8.507059173023462e37),
    );
    check(
        "-(-9223372036854775808)",
        json!({}),
        json!(9223372036854775808u64),
    );
}

#[test]
fn strings_and_lists_concatenate() {
    check("'a' + 'b'", json!({}), json!("ab"));
    check("[1] + [2, 3]", json!({}), json!([1, 2, 3]));
    check_ctx("params.tags + ['c']", json!(["a", "b", "c"]));
    check_ctx("'db-' + params.cluster", json!("db-east"));
}

#[test]
fn comparisons_work_on_numbers_and_strings() {
    check("1 < 2", json!({}), json!(true));
    check("2 <= 2", json!({}), json!(true));
    check("2.5 > 2", json!({}), json!(true));
    check("2 >= 3", json!({}), json!(false));
    check("'a' < 'b'", json!({}), json!(true));
    check("'b' < 'a'", json!({}), json!(false));
    check("'B' < 'a'", json!({}), json!(true));
    check(
        "18446744073709551615 > 9223372036854775807",
        json!({}),
        json!(true),
    );
    check_ctx("len(steps.check.output.hosts) > 0", json!(true));
}

#[test]
fn equality_is_deep_and_numeric() {
    check("1 == 1.0", json!({}), json!(true));
    check("1 != 1.0", json!({}), json!(false));
    check("1 == '1'", json!({}), json!(false));
    check("null == null", json!({}), json!(true));
    check("[1, [2]] == [1.0, [2.0]]", json!({}), json!(true));
    check("[1, 2] == [2, 1]", json!({}), json!(false));
    check(
        "a == b",
        json!({"a": {"x": 1, "y": [2]}, "b": {"y": [2.0], "x": 1}}),
        json!(true),
    );
    check(
        "a == b",
        json!({"a": {"x": 1}, "b": {"x": 1, "y": 2}}),
        json!(false),
    );
    check_ctx("params.env == 'prod'", json!(true));
    check_ctx("params.missing == null", json!(true));
    check("1 == 1 == true", json!({}), json!(true));
}

#[test]
fn logical_operators_return_the_deciding_operand() {
    check_ctx("params.missing || 'default'", json!("default"));
    check_ctx("params.env || 'default'", json!("prod"));
    check_ctx("params.empty || 'default'", json!("default"));
    check("0 || null", json!({}), json!(null));
    check("'x' && 2", json!({}), json!(2));
    check("[] && 2", json!({}), json!([]));
    check("1 && 2 && 3", json!({}), json!(3));
    check("0 || '' || 'last'", json!({}), json!("last"));
    check("false || true && false", json!({}), json!(false));
    check("true || true && false", json!({}), json!(true));
    check_ctx(
        "params.env == 'prod' && len(steps.check.output.hosts) > 0",
        json!(true),
    );
}

#[test]
fn logical_operators_short_circuit() {
    let context = json!({"zero": 0, "one": 1});
    check("true || 1 / zero", context.clone(), json!(true));
    check("false && 1 / zero", context.clone(), json!(false));
    check("null && ('a' + one)", context.clone(), json!(null));
    check("default(1, 1 / zero)", context, json!(1));
}

#[test]
fn not_uses_truthiness() {
    check("!''", json!({}), json!(true));
    check("!'x'", json!({}), json!(false));
    check("!0", json!({}), json!(true));
    check("!0.0", json!({}), json!(true));
    check("![]", json!({}), json!(true));
    check("!!params", json!({"params": {}}), json!(false));
    check("!null", json!({}), json!(true));
    check("!!1", json!({}), json!(true));
    check("!1 == false", json!({}), json!(true));
}

#[test]
fn truthiness_matches_the_documented_rules() {
    for falsy in [
        json!(null),
        json!(false),
        json!(0),
        json!(0.0),
        json!(-0.0),
        json!(""),
        json!([]),
        json!({}),
    ] {
        assert!(!truthy(&falsy), "{falsy}");
    }
    for value in [
        json!(true),
        json!(1),
        json!(-0.5),
        json!("0"),
        json!("false"),
        json!([0]),
        json!({"a": null}),
    ] {
        assert!(truthy(&value), "{value}");
    }
}

#[test]
fn in_checks_membership() {
    check("2 in [1, 2]", json!({}), json!(true));
    check("2.0 in [1, 2]", json!({}), json!(true));
    check("3 in [1, 2]", json!({}), json!(false));
    check("'ell' in 'hello'", json!({}), json!(true));
    check("'xyz' in 'hello'", json!({}), json!(false));
    check_ctx("'env' in params", json!(true));
    check_ctx("'nope' in params", json!(false));
    check_ctx("params.env in ['prod', 'staging']", json!(true));
    check_ctx("'a' in params.missing", json!(false));
    check("1 + 1 in [2]", json!({}), json!(true));
}

#[test]
fn type_errors_are_reported_at_evaluation() {
    check_eval_error("params.env + 1", "cannot add string and number");
    check_eval_error("params.missing + 1", "cannot add null and number");
    check_eval_error("params.env - 1", "cannot subtract number from string");
    check_eval_error("params.tags * 2", "cannot multiply list by number");
    check_eval_error("params.env < 1", "cannot compare string and number");
    check_eval_error("params.missing < 1", "cannot compare null and number");
    check_eval_error("-params.env", "cannot negate string");
    check_eval_error(
        "params.storage in params.env",
        "cannot check if number is in a string",
    );
    check_eval_error(
        "1 in params",
        "cannot check if number is a key of an object",
    );
    check_eval_error("params.storage in 2", "cannot check membership in number");
}

#[test]
fn division_by_zero_is_an_error() {
    let context = json!({"zero": 0, "float_zero": 0.0});
    assert_eq!(
        Expr::parse("1 / zero").unwrap().eval(&context),
        Err(EvalError::DivisionByZero)
    );
    check_eval_error_in("1 % zero", context.clone(), "division by zero");
    check_eval_error_in("1.5 / zero", context.clone(), "division by zero");
    check_eval_error_in("1 / float_zero", context, "division by zero");
}

#[test]
fn non_finite_numbers_are_an_error() {
    check_eval_error_in("x * 10", json!({"x": 1e308}), "number out of range");
}

#[test]
fn oversized_results_are_an_error() {
    check("len(range(1000000))", json!({}), json!(1_000_000));
    let context = json!({"most": 1_000_000, "over": 1_000_001});
    check_eval_error_in("range(over)", context.clone(), "result too large");
    check_eval_error_in("range(most) + [1]", context.clone(), "result too large");
    check_eval_error_in("toJSON(range(most))", context.clone(), "result too large");
    check_eval_error_in("join(range(most), ',')", context, "result too large");
    let big = "x".repeat(600_000);
    let ctx = json!({"s": big});
    let expr = Expr::parse("s + s").unwrap();
    assert_eq!(expr.eval(&ctx), Err(EvalError::TooLarge));
    assert_eq!(
        Expr::parse("split(s, '')")
            .unwrap()
            .eval(&json!({"s": "y".repeat(1_000_001)})),
        Err(EvalError::TooLarge)
    );
}

#[test]
fn long_operator_chains_evaluate_iteratively() {
    let src = format!("1{}", " +1".repeat(1300));
    check(&src, json!({}), json!(1301));
    let src = format!("a{}", "||a".repeat(1300));
    check(&src, json!({"a": 0}), json!(0));
    let src = format!("a{}", ".b".repeat(2000));
    check(&src, json!({}), json!(null));
}
