//! String-valued state enums: one spelling per variant, shared by the wire
//! (serde), the database (a `TEXT` column) and the code.
//!
//! [`text_state!`] defines an enum from `Variant = "spelling"` pairs and
//! gives it `as_str`, `parse`, `ALL`, [`std::fmt::Display`],
//! [`std::str::FromStr`] and — under the `diesel` feature — `ToSql`/`FromSql`
//! for `diesel::sql_types::Text` on PostgreSQL, the way [`crate::ids`] maps ids.
//!
//! Reading a value the enum does not know is an error ([`UnknownState`]),
//! never a plausible default: a corrupt row surfaces as a deserialize error
//! that the caller logs and answers as a 500 problem.

/// A stored or received string that is not a spelling of the expected state enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a known {kind}")]
pub struct UnknownState {
    /// The enum's name, e.g. `OperationStatus`.
    pub kind: &'static str,
    /// The value that was read.
    pub value: String,
}

/// Defines a state enum whose variants are spelled by string literals.
///
/// ```ignore
/// text_state! {
///     /// Docs.
///     #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
///     #[serde(rename_all = "snake_case")]
///     pub enum Colour {
///         /// Docs.
///         Red = "red",
///     }
/// }
/// ```
///
/// The enum must derive `Copy`. Its serde spelling is given separately (by
/// `rename_all`); the unit tests of each enum check that both agree. Crate
/// internal: the `diesel` feature is evaluated where the macro expands, so a
/// new state enum that needs a column mapping lives in this crate.
macro_rules! text_state {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[cfg_attr(feature = "diesel", derive(diesel::expression::AsExpression, diesel::deserialize::FromSqlRow))]
        #[cfg_attr(feature = "diesel", diesel(sql_type = diesel::sql_types::Text))]
        pub enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The wire and database spelling.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text),+
                }
            }

            /// Parses the wire and database spelling; `None` for anything else.
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($text => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::state::UnknownState;

            /// Parses the wire and database spelling; [`UnknownState`](crate::state::UnknownState) otherwise.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s).ok_or_else(|| $crate::state::UnknownState { kind: stringify!($name), value: s.to_owned() })
            }
        }

        #[cfg(feature = "diesel")]
        impl diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg> for $name {
            fn to_sql<'b>(&'b self, out: &mut diesel::serialize::Output<'b, '_, diesel::pg::Pg>) -> diesel::serialize::Result {
                <str as diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg>>::to_sql(self.as_str(), out)
            }
        }

        /// An unknown stored spelling is a deserialize error naming the enum and
        /// the value, never a default.
        #[cfg(feature = "diesel")]
        impl diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg> for $name {
            fn from_sql(bytes: diesel::pg::PgValue<'_>) -> diesel::deserialize::Result<Self> {
                let s = <String as diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg>>::from_sql(bytes)?;
                Ok(s.parse::<Self>()?)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use crate::endpoint::EndpointStatus;
    use crate::operation::{OperationStatus, Phase, ScanOutcome};
    use crate::upload::UploadStatus;
    use crate::video::VideoStatus;

    /// `as_str`, `parse`, `FromStr` and serde agree for every variant.
    fn agrees<T>(all: &[T], as_str: fn(T) -> &'static str)
    where
        T: Copy + PartialEq + std::fmt::Debug + std::str::FromStr + serde::Serialize + serde::de::DeserializeOwned,
    {
        for &v in all {
            let s = as_str(v);
            assert_eq!(serde_json::to_value(v).unwrap(), s, "serde spelling of {v:?}");
            assert_eq!(serde_json::from_value::<T>(serde_json::Value::from(s)).unwrap(), v);
            assert_eq!(s.parse::<T>().ok(), Some(v));
        }
    }

    #[test]
    fn every_state_spells_the_same_on_the_wire_and_in_the_database() {
        agrees(UploadStatus::ALL, UploadStatus::as_str);
        agrees(OperationStatus::ALL, OperationStatus::as_str);
        agrees(VideoStatus::ALL, VideoStatus::as_str);
        agrees(Phase::ALL, Phase::as_str);
        agrees(EndpointStatus::ALL, EndpointStatus::as_str);
        agrees(ScanOutcome::ALL, ScanOutcome::as_str);
        assert_eq!(Phase::ALL.len(), 7);
    }

    #[test]
    fn an_unknown_spelling_is_an_error_naming_the_enum() {
        let err = "done".parse::<OperationStatus>().unwrap_err();
        assert_eq!(err.kind, "OperationStatus");
        assert_eq!(err.value, "done");
        assert_eq!(err.to_string(), "`done` is not a known OperationStatus");
        assert!("Enabled".parse::<EndpointStatus>().is_err());
        assert_eq!(VideoStatus::parse(""), None);
    }
}
