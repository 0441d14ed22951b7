//! [`Scheme`]: which signature format an endpoint is sent.

use std::fmt;

/// A webhook signature format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// Our default format: `Webhook-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]`
    /// signing `"<t>.<body>"`.
    WebhookSignature,
    /// [Standard Webhooks](https://www.standardwebhooks.com/):
    /// `webhook-id`, `webhook-timestamp` and `webhook-signature: v1,<base64>[ v1,<base64>…]`
    /// signing `"<id>.<timestamp>.<body>"`.
    StandardWebhooks,
}

impl Scheme {
    /// The format's stable name: `webhook-signature` or `standard-webhooks`.
    ///
    /// ```
    /// assert_eq!(vid_webhooks::Scheme::StandardWebhooks.as_str(), "standard-webhooks");
    /// ```
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Scheme::WebhookSignature => "webhook-signature",
            Scheme::StandardWebhooks => "standard-webhooks",
        }
    }
}

impl fmt::Display for Scheme {
    /// Writes [`Scheme::as_str`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
