//! The OpenAPI schemas (feature `openapi`) that a wire type's `#[derive(utoipa::ToSchema)]`
//! cannot say by itself: a field whose JSON takes two forms, the items of a list of names, the
//! answer to creating a webhook (a [`WebhookView`] that also carries its secret) and the answer
//! about a queue or a pattern ([`QueueAnswer`]). The server assembles them with the derived ones
//! into its document.

use std::borrow::Cow;

use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, AnyOfBuilder, ArrayBuilder, ObjectBuilder, OneOfBuilder,
    Schema, Type,
};
use utoipa::openapi::{Ref, RefOr, schema::SchemaType};
use utoipa::{PartialSchema, ToSchema};

use crate::{QueuePrefixView, QueueView, WebhookView};

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String)
}

/// `PollRequest.queues`: 1 to 64 queue names of 1 to 128 bytes each.
pub(crate) fn queue_names() -> ArrayBuilder {
    ArrayBuilder::new()
        .items(
            string()
                .min_length(Some(1))
                .max_length(Some(128))
                .description(Some("1 to 128 bytes.")),
        )
        .min_items(Some(1))
        .max_items(Some(64))
}

/// `RateSettings.per`: a duration text or a number of seconds.
pub(crate) fn rate_per() -> OneOfBuilder {
    OneOfBuilder::new()
        .item(string().min_length(Some(1)))
        .item(ObjectBuilder::new().schema_type(Type::Number))
        .description(Some(
            "A duration (`1m`) or a number of seconds; a value that is not one is a 400 naming \
             `rate.per`, zero is a 422.",
        ))
}

/// `QueueSettings.max_wait`: a duration text or a number of seconds, or null.
pub(crate) fn max_wait() -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([
            Type::String,
            Type::Number,
            Type::Null,
        ]))
        .exclusive_minimum(Some(0))
        .description(Some(
            "How long a ready task may wait before it goes ahead of priority order: a duration \
             (`500ms`, `30s`, `5m`, `2h`, `1d`, or compound as `1h30m`) or a number of seconds. \
             A value that is neither is a 400; one of zero (under a millisecond) is a 422.",
        ))
}

/// The answer to creating a webhook: [`WebhookView`] with the subscription's `secret`, shown
/// only then (the server sends it in `WebhookView::secret`, which other answers leave out).
pub struct CreatedWebhook;

impl PartialSchema for CreatedWebhook {
    fn schema() -> RefOr<Schema> {
        let RefOr::T(Schema::Object(mut view)) = WebhookView::schema() else {
            unreachable!("WebhookView is an object");
        };
        view.description =
            Some("A new subscription: the fields of WebhookView plus `secret`.".into());
        if let Some(RefOr::T(Schema::Object(url))) = view.properties.get_mut("url") {
            url.description = Some("The URL as given, in full (creating needs `operate`).".into());
        }
        view.properties.insert(
            "secret".into(),
            string()
                .description(Some("The signing secret, given or made; shown only here."))
                .into(),
        );
        view.required.push("secret".into());
        view.additional_properties = None::<Box<AdditionalProperties<Schema>>>;
        Schema::Object(view).into()
    }
}

impl ToSchema for CreatedWebhook {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("CreatedWebhook")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        WebhookView::schemas(schemas);
    }
}

/// What `GET` and `PUT /api/v1/queues/{name}` answer: a [`QueueView`] when the name is a
/// queue's, the [`QueuePrefixView`] of a pattern (`agent-*`).
pub struct QueueAnswer;

impl PartialSchema for QueueAnswer {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(Ref::from_schema_name(QueueView::name()))
            .item(Ref::from_schema_name(QueuePrefixView::name()))
            .description(Some(
                "A QueueView for a queue's name; a QueuePrefixView for a pattern (a name \
                 followed by `*`).",
            ))
            .into()
    }
}

impl ToSchema for QueueAnswer {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("QueueAnswer")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        for (name, schema) in [
            (QueueView::name(), QueueView::schema()),
            (QueuePrefixView::name(), QueuePrefixView::schema()),
        ] {
            schemas.push((name.into_owned(), schema));
        }
        QueueView::schemas(schemas);
        QueuePrefixView::schemas(schemas);
    }
}

/// `SubmitJob` as derived, with the rule its description states: a job names a `workflow` or
/// gives a `definition` (at least one of them).
pub fn submit_job(derived: RefOr<Schema>) -> RefOr<Schema> {
    let RefOr::T(Schema::Object(mut fields)) = derived else {
        return derived;
    };
    let given = |field: &str, schema: ObjectBuilder| {
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .required(field)
            .property(field, schema)
            .additional_properties(Some(AdditionalProperties::FreeForm(true)))
    };
    let description = fields.description.take();
    AllOfBuilder::new()
        .item(fields)
        .item(
            AnyOfBuilder::new()
                .item(given("workflow", string().min_length(Some(1))))
                .item(given(
                    "definition",
                    ObjectBuilder::new().schema_type(Type::Object),
                )),
        )
        .description(description)
        .into()
}
