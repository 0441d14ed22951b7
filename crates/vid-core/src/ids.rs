//! Typed, prefixed identifiers.
//!
//! Every resource id is a [ULID](https://github.com/ulid/spec) (48-bit
//! millisecond timestamp + 80 random bits, Crockford base32, written in lower
//! case) behind a resource prefix: `op_01jd8x…`. Ids therefore sort by
//! creation time, which the list endpoints use as their cursor order.
//!
//! Ids are generated in one place ([`OperationId::generate`] and friends) and
//! parsed at the edge ([`std::str::FromStr`], serde): a function that takes an
//! [`EndpointId`] cannot be handed a [`VideoId`].

use std::fmt;
use std::str::FromStr;

/// Why a string is not an id of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The string does not start with the resource prefix (e.g. `op_`).
    #[error("expected an id starting with `{expected}`")]
    WrongPrefix {
        /// The prefix this id type requires, with its underscore.
        expected: &'static str,
    },
    /// The part after the prefix is not a 26-character Crockford base32 ULID.
    #[error("`{0}` is not a valid id body (26 Crockford base32 characters)")]
    InvalidBody(String),
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[cfg_attr(feature = "diesel", derive(diesel::expression::AsExpression, diesel::deserialize::FromSqlRow))]
        #[cfg_attr(feature = "diesel", diesel(sql_type = diesel::sql_types::Text))]
        pub struct $name(String);

        impl $name {
            /// The prefix every id of this kind carries, including the underscore.
            pub const PREFIX: &'static str = $prefix;

            /// A new id: the current time in milliseconds plus 80 random bits.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, ulid::Ulid::new().to_string().to_ascii_lowercase()))
            }

            /// The id as written on the wire, e.g. `op_01jd8x4m3v0k2q6s7t9w1y5zab`.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The creation time encoded in the id, in milliseconds since the Unix epoch.
            pub fn timestamp_ms(&self) -> u64 {
                ulid::Ulid::from_string(&self.0[$prefix.len()..]).map(|u| u.timestamp_ms()).unwrap_or(0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            /// Parses `<prefix><26 Crockford base32 chars>`; upper or lower case is accepted and
            /// normalised to lower case.
            fn from_str(s: &str) -> Result<Self, IdError> {
                let body = s.strip_prefix($prefix).ok_or(IdError::WrongPrefix { expected: $prefix })?;
                if body.len() != 26 {
                    return Err(IdError::InvalidBody(body.to_owned()));
                }
                ulid::Ulid::from_string(body).map_err(|_| IdError::InvalidBody(body.to_owned()))?;
                Ok(Self(format!("{}{}", $prefix, body.to_ascii_lowercase())))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        /// A string `<prefix><26 Crockford base32 characters>` (the ULID's first
        /// character is 0–7; upper case is accepted and answered in lower case).
        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                utoipa::openapi::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .description(Some(concat!(
                        "An id: `", $prefix, "` followed by a 26-character lower-case ULID ",
                        "(Crockford base32; ids sort by creation time)."
                    )))
                    .pattern(Some(concat!("^", $prefix, "[0-7][0-9a-hjkmnp-tv-zA-HJKMNP-TV-Z]{25}$")))
                    .min_length(Some($prefix.len() + 26))
                    .max_length(Some($prefix.len() + 26))
                    .examples([serde_json::Value::String(concat!($prefix, "01jd8x4m3v0k2q6s7t9w1y5zab").to_owned())])
                    .build()
                    .into()
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {
            fn name() -> std::borrow::Cow<'static, str> {
                std::borrow::Cow::Borrowed(stringify!($name))
            }
        }

        #[cfg(feature = "diesel")]
        impl diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg> for $name {
            fn to_sql<'b>(&'b self, out: &mut diesel::serialize::Output<'b, '_, diesel::pg::Pg>) -> diesel::serialize::Result {
                <str as diesel::serialize::ToSql<diesel::sql_types::Text, diesel::pg::Pg>>::to_sql(self.0.as_str(), out)
            }
        }

        #[cfg(feature = "diesel")]
        impl diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg> for $name {
            fn from_sql(bytes: diesel::pg::PgValue<'_>) -> diesel::deserialize::Result<Self> {
                let s = <String as diesel::deserialize::FromSql<diesel::sql_types::Text, diesel::pg::Pg>>::from_sql(bytes)?;
                Ok(s.parse()?)
            }
        }
    };
}

prefixed_id!(
    /// A tenant: the customer account that owns API keys, uploads, videos and endpoints. `ten_…`
    TenantId, "ten_"
);
prefixed_id!(
    /// An API key's public id (the secret part is never stored). `key_…`
    ApiKeyId, "key_"
);
prefixed_id!(
    /// A direct-to-storage multipart upload. `upl_…`
    UploadId, "upl_"
);
prefixed_id!(
    /// A video: the source file plus its renditions and poster. `vid_…`
    VideoId, "vid_"
);
prefixed_id!(
    /// A long-running operation (a transcode). `op_…`
    OperationId, "op_"
);
prefixed_id!(
    /// An event announced to webhook endpoints; also the `Webhook-Id` header. `evt_…`
    EventId, "evt_"
);
prefixed_id!(
    /// A customer's webhook endpoint. `ep_…`
    EndpointId, "ep_"
);
prefixed_id!(
    /// One event to one endpoint: the unit that is retried. `dlv_…`
    DeliveryId, "dlv_"
);
prefixed_id!(
    /// One HTTP try of a delivery. `att_…`
    AttemptId, "att_"
);
prefixed_id!(
    /// A playback ID: how a ready video is played (`/play/pb_….m3u8`), never
    /// through storage URLs. A `public` one is itself the capability; a
    /// `signed` one also needs a JWT (issue 20). `pb_…`
    PlaybackId, "pb_"
);
prefixed_id!(
    /// A tenant's signing key for playback tokens: we keep its public half,
    /// the customer's server signs with the private half (issue 20). `sk_…`
    SigningKeyId, "sk_"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_carry_their_prefix_and_parse_back() {
        let id = OperationId::generate();
        assert!(id.as_str().starts_with("op_"));
        assert_eq!(id.as_str().len(), 3 + 26);
        assert_eq!(id.as_str(), id.as_str().to_ascii_lowercase());
        let parsed: OperationId = id.as_str().parse().unwrap();
        assert_eq!(parsed, id);
    }

    #[test]
    fn a_video_id_is_not_an_operation_id() {
        let vid = VideoId::generate();
        let err = vid.as_str().parse::<OperationId>().unwrap_err();
        assert_eq!(err, IdError::WrongPrefix { expected: "op_" });
    }

    #[test]
    fn bodies_are_checked() {
        assert!(matches!("op_".parse::<OperationId>(), Err(IdError::InvalidBody(_))));
        assert!(matches!("op_123".parse::<OperationId>(), Err(IdError::InvalidBody(_))));
        // 'u' is not in the Crockford alphabet.
        assert!("op_uuuuuuuuuuuuuuuuuuuuuuuuuu".parse::<OperationId>().is_err());
        // Upper case is accepted and normalised.
        let id = EventId::generate();
        let upper = format!("evt_{}", id.as_str()[4..].to_ascii_uppercase());
        assert_eq!(upper.parse::<EventId>().unwrap(), id);
    }

    #[test]
    fn ids_round_trip_through_serde_and_sort_by_time() {
        let a = UploadId::generate();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = UploadId::generate();
        assert!(a < b, "ids sort by creation time");
        assert!(a.timestamp_ms() <= b.timestamp_ms());
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, format!("\"{}\"", a.as_str()));
        assert_eq!(serde_json::from_str::<UploadId>(&json).unwrap(), a);
        assert!(serde_json::from_str::<UploadId>("\"vid_01jd8x4m3v0k2q6s7t9w1y5zab\"").is_err());
    }
}
