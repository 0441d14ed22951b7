//! The envelope of every list endpoint (`GET /operations`, `/videos`,
//! `/webhook-endpoints`, `/webhook-endpoints/{id}/deliveries`, `/events`).

use serde::{Deserialize, Serialize};

/// A page of a list endpoint: `{"data": [...], "next_cursor": "op_…" | null}`.
///
/// Items are newest first (ids sort by creation time). `next_cursor` is the id
/// of the last item when more may follow; pass it back as the `cursor` query
/// parameter for the next page. A missing `next_cursor` reads as `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Page<T> {
    /// Items, newest first.
    pub data: Vec<T>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_has_the_documented_shape() {
        let page = Page { data: vec![1, 2], next_cursor: Some("op_x".to_owned()) };
        let v = serde_json::to_value(&page).unwrap();
        assert_eq!(v, serde_json::json!({"data": [1, 2], "next_cursor": "op_x"}));
        let last: Page<u8> = serde_json::from_str(r#"{"data": []}"#).unwrap();
        assert_eq!(last.next_cursor, None);
        let v = serde_json::to_value(Page::<u8> { data: vec![], next_cursor: None }).unwrap();
        assert_eq!(v["next_cursor"], serde_json::Value::Null);
    }
}
