//! The [`Headers`] abstraction over request header collections.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

/// Header names, lowercase (HTTP header names are case-insensitive; HTTP/2
/// requires lowercase on the wire).
pub mod names {
    /// The delivery's unique id, e.g. `evt_01J…` or `msg_…`. Sent by both
    /// formats; signed only by Standard Webhooks.
    pub const WEBHOOK_ID: &str = "webhook-id";
    /// The signature header of both formats (the value's shape differs).
    pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
    /// Unix seconds of the delivery attempt (Standard Webhooks only; our
    /// format carries the timestamp inside `webhook-signature` as `t=`).
    pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
}

/// Read access to the headers of a received request.
///
/// Names are matched ASCII case-insensitively. When a header occurs several
/// times, the first occurrence is used. Values are raw bytes; a value that is
/// not valid UTF-8 is reported as [`VerifyError::HeaderMalformed`](crate::VerifyError::HeaderMalformed).
///
/// Implemented for:
///
/// * slices, arrays and `Vec`s of `(name, value)` pairs whose items are
///   `AsRef<str>` (`&str`, `String`, …);
/// * `HashMap` and `BTreeMap` from `AsRef<str>` to `AsRef<str>`
///   (looked up case-insensitively, so keys may be in any case);
/// * `http::HeaderMap` with the `http` cargo feature;
/// * references to any of these.
///
/// Implement it yourself for other frameworks; one method is enough.
///
/// # Examples
///
/// ```
/// use vid_webhooks::Headers;
///
/// let headers = [("Webhook-Id", "evt_1"), ("Content-Type", "application/json")];
/// assert_eq!(headers.header("webhook-id"), Some(&b"evt_1"[..]));
/// assert_eq!(headers.header("webhook-signature"), None);
/// ```
pub trait Headers {
    /// The value of the first header called `name` (ASCII case-insensitive),
    /// as raw bytes, or `None` when absent. `name` is given in lowercase.
    fn header(&self, name: &str) -> Option<&[u8]>;
}

impl<T: Headers + ?Sized> Headers for &T {
    fn header(&self, name: &str) -> Option<&[u8]> {
        (**self).header(name)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Headers for [(K, V)] {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name)).map(|(_, v)| v.as_ref().as_bytes())
    }
}

impl<K: AsRef<str>, V: AsRef<str>, const N: usize> Headers for [(K, V); N] {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.as_slice().header(name)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Headers for Vec<(K, V)> {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.as_slice().header(name)
    }
}

impl<K: AsRef<str>, V: AsRef<str>, S: BuildHasher> Headers for HashMap<K, V, S> {
    fn header(&self, name: &str) -> Option<&[u8]> {
        // Keys may be in any case, so a hashed lookup is not enough. When
        // several keys differ only in case, the one picked is unspecified.
        self.iter().find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name)).map(|(_, v)| v.as_ref().as_bytes())
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Headers for BTreeMap<K, V> {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(k, _)| k.as_ref().eq_ignore_ascii_case(name)).map(|(_, v)| v.as_ref().as_bytes())
    }
}

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
impl Headers for http::HeaderMap {
    fn header(&self, name: &str) -> Option<&[u8]> {
        // `HeaderMap` stores names lowercased and looks them up the same way.
        self.get(name).map(http::HeaderValue::as_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_are_case_insensitive_and_first_wins() {
        let pairs = vec![("WEBHOOK-SIGNATURE".to_owned(), "first".to_owned()), ("webhook-signature".to_owned(), "second".to_owned())];
        assert_eq!(pairs.header("webhook-signature"), Some(&b"first"[..]));

        let mut map = HashMap::new();
        map.insert("Webhook-Timestamp", "1");
        assert_eq!(map.header("webhook-timestamp"), Some(&b"1"[..]));
        assert_eq!(map.header("webhook-id"), None);

        let btree: BTreeMap<String, String> = [("Webhook-Id".into(), "evt_1".into())].into_iter().collect();
        assert_eq!(Headers::header(&&btree, "webhook-id"), Some(&b"evt_1"[..]));
    }

    #[cfg(feature = "http")]
    #[test]
    fn header_map() {
        let mut map = http::HeaderMap::new();
        map.insert("Webhook-Id", http::HeaderValue::from_static("evt_1"));
        assert_eq!(map.header("webhook-id"), Some(&b"evt_1"[..]));
        assert_eq!(map.header("webhook-signature"), None);
    }
}
