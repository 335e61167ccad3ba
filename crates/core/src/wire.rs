//! The closed sets of values the HTTP API carries as strings (statuses, kinds, policies, scopes),
//! and how a client reads one it does not know.
//!
//! Each set is a plain enum, defined once in this crate with `string_enum!`: its values, their
//! text (which is also their JSON, `snake_case`), `ALL`, `as_str` and `parse`, and the
//! [`WireEnum`] trait over those. The domain's enums stay closed: the state machine, the store
//! and the server only ever hold a value they know.
//!
//! The API's wire types (`starbridge-api`) hold such a value as [`Open<T>`] instead: `Known(T)`
//! for a value this build knows, `Unknown(text)` for any other string, kept as sent. A newer
//! server may add values (a status, an event kind); a client built before them reads them as
//! `Unknown` and goes on rather than failing to decode the whole answer. `Open` serializes to
//! exactly the text of its value, so the JSON is the same as the enum's own. A server reads
//! requests into the same types and refuses an `Unknown` with a problem naming the field: it
//! accepts only what it knows.
//!
//! The enums here are the ones only the API shows (health, deliveries); the others live with
//! their domain (`model`, `dispatch`, `schedule`, `scope`).

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A closed set of values written as strings: what `string_enum!` defines.
pub trait WireEnum: Copy + Eq + fmt::Debug + 'static {
    /// Every value, in declaration order.
    const ALL: &'static [Self];

    /// The value's text (and JSON string).
    fn as_str(self) -> &'static str;

    /// The value whose text is `text`.
    fn parse(text: &str) -> Option<Self>;
}

/// Defines a closed enum written as strings: `Name { Variant => "text", … }`, with `ALL`,
/// `as_str`, `parse`, `Display`, serde (as `snake_case`, which must be the text given) and
/// [`WireEnum`]; with the `openapi` feature, also its OpenAPI schema (`utoipa::ToSchema`, named
/// as the enum: a string of one of the values, described by the enum's doc comment). Attributes
/// before the name (docs, another `derive`) go on the enum, those before a variant (docs,
/// `#[default]`) on the variant.
macro_rules! string_enum {
    ($(#[$($meta:tt)*])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$($meta)*])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            serde::Serialize, serde::Deserialize,
        )]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            pub fn parse(text: &str) -> Option<$name> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl $crate::wire::WireEnum for $name {
            const ALL: &'static [$name] = $name::ALL;

            fn as_str(self) -> &'static str {
                $name::as_str(self)
            }

            fn parse(text: &str) -> Option<$name> {
                $name::parse(text)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                $crate::wire::enum_schema(
                    &[$($text),+],
                    $crate::wire::doc_text!($(#[$($meta)*])*),
                )
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($name))
            }
        }
    };
}

pub(crate) use string_enum;

/// The text of the doc comments among attributes, a line each (other attributes are skipped).
#[cfg(feature = "openapi")]
macro_rules! doc_text {
    () => { "" };
    (#[doc = $line:literal] $($rest:tt)*) => {
        concat!($line, "\n", $crate::wire::doc_text!($($rest)*))
    };
    (#[$($other:tt)*] $($rest:tt)*) => { $crate::wire::doc_text!($($rest)*) };
}

#[cfg(feature = "openapi")]
pub(crate) use doc_text;

/// The OpenAPI schema of a string enum: a string of one of `values`, described by the enum's
/// doc comment (`doc`, its lines joined).
#[cfg(feature = "openapi")]
pub fn enum_schema(
    values: &[&str],
    doc: &str,
) -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    let description = doc.lines().map(str::trim).collect::<Vec<_>>().join(" ");
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(values.iter().copied()))
        .description(Some(description.trim()))
        .into()
}

/// A value of the closed set `T` as the wire carries it: one this build knows, or the text of
/// one it does not (from a newer server, or a client's typo that the server will refuse).
///
/// Reading (`Deserialize`, [`Open::parse`], `FromStr`) gives `Unknown` only for text that is
/// none of `T`'s values; writing gives the text back unchanged. It reads from and writes to a
/// JSON string (or a query parameter) exactly as a `String` would.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Open<T> {
    Known(T),
    Unknown(String),
}

/// The known default: what a reader assumes when an older writer left the field out.
impl<T: Default> Default for Open<T> {
    fn default() -> Self {
        Open::Known(T::default())
    }
}

impl<T: WireEnum> Open<T> {
    /// The value whose text is `text`, or `Unknown(text)`.
    pub fn parse(text: &str) -> Open<T> {
        T::parse(text).map_or_else(|| Open::Unknown(text.to_owned()), Open::Known)
    }

    /// The value, if this build knows it.
    pub fn known(&self) -> Option<T> {
        match self {
            Open::Known(value) => Some(*value),
            Open::Unknown(_) => None,
        }
    }

    /// The text, as on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Open::Known(value) => value.as_str(),
            Open::Unknown(text) => text,
        }
    }
}

impl<T> From<T> for Open<T> {
    fn from(value: T) -> Open<T> {
        Open::Known(value)
    }
}

impl<T: WireEnum> PartialEq<T> for Open<T> {
    fn eq(&self, other: &T) -> bool {
        self.known() == Some(*other)
    }
}

impl<T: WireEnum> fmt::Display for Open<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<T: WireEnum> FromStr for Open<T> {
    type Err = Infallible;

    fn from_str(text: &str) -> Result<Open<T>, Infallible> {
        Ok(Open::parse(text))
    }
}

impl<T: WireEnum> Serialize for Open<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de, T: WireEnum> Deserialize<'de> for Open<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Open<T>, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(match T::parse(&text) {
            Some(value) => Open::Known(value),
            None => Open::Unknown(text),
        })
    }
}

string_enum!(
    /// Whether a server reads and writes its database (`GET /healthz`).
    HealthStatus {
        Ok => "ok",
        Unhealthy => "unhealthy",
    }
);

string_enum!(
    /// Whether the database takes writes.
    DatabaseHealth {
        /// A write succeeded in the last 10 s, or a probe write just did.
        Ok => "ok",
        /// The disk holding the database is full: writes are refused.
        Full => "full",
        /// The database or its filesystem is read-only: writes are refused.
        ReadOnly => "read_only",
        /// The database cannot be reached, or fails writes for another reason.
        Unavailable => "unavailable",
    }
);

string_enum!(
    /// Where a webhook message is in its delivery.
    DeliveryState {
        /// Not delivered yet; another attempt is due.
        Pending => "pending",
        /// The receiver accepted it.
        Delivered => "delivered",
        /// Given up.
        Failed => "failed",
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::QueueMode;
    use crate::model::{
        AttemptOutcome, BulkAction, ErrorKind, EventKind, JobStatus, TaskKind, TaskStatus,
    };
    use crate::schedule::{CatchUpKind, Overlap};
    use crate::scope::Scope;

    /// The enum's own serde, its text and `Open`'s JSON agree for every value of `T`.
    fn agrees<T: WireEnum + Serialize + for<'de> Deserialize<'de>>() {
        for &value in T::ALL {
            let text = serde_json::Value::String(value.as_str().to_owned());
            assert_eq!(serde_json::to_value(value).unwrap(), text, "{value:?}");
            assert_eq!(serde_json::to_value(Open::Known(value)).unwrap(), text);
            assert_eq!(serde_json::from_value::<T>(text.clone()).unwrap(), value);
            assert_eq!(
                serde_json::from_value::<Open<T>>(text).unwrap(),
                Open::Known(value)
            );
            assert_eq!(T::parse(value.as_str()), Some(value));
        }
    }

    #[test]
    fn every_wire_enum_serializes_as_its_text() {
        agrees::<JobStatus>();
        agrees::<TaskStatus>();
        agrees::<TaskKind>();
        agrees::<ErrorKind>();
        agrees::<EventKind>();
        agrees::<AttemptOutcome>();
        agrees::<BulkAction>();
        agrees::<QueueMode>();
        agrees::<Overlap>();
        agrees::<CatchUpKind>();
        agrees::<Scope>();
        agrees::<HealthStatus>();
        agrees::<DatabaseHealth>();
        agrees::<DeliveryState>();
        agrees::<crate::webhook::WebhookEvent>();
    }

    #[test]
    fn unknown_text_is_kept_and_written_back() {
        let open: Open<JobStatus> = serde_json::from_str(r#""hibernating""#).unwrap();
        assert_eq!(open, Open::Unknown("hibernating".to_owned()));
        assert_eq!(open.known(), None);
        assert_eq!(open.to_string(), "hibernating");
        assert_eq!(serde_json::to_string(&open).unwrap(), r#""hibernating""#);
        assert_eq!("queued".parse(), Ok(Open::Known(JobStatus::Queued)));
        assert!(Open::Known(JobStatus::Failed) == JobStatus::Failed);
        assert!(open != JobStatus::Failed);
    }

    #[test]
    fn only_strings_are_read_as_a_string_is() {
        let error = serde_json::from_str::<Open<JobStatus>>("5").unwrap_err();
        let same = serde_json::from_str::<String>("5").unwrap_err();
        assert_eq!(error.to_string(), same.to_string());
    }
}
