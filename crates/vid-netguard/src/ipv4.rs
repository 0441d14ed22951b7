//! Lenient IPv4 parsing: every notation that `inet_aton(3)` (used by
//! `getaddrinfo` and therefore by most HTTP clients and resolvers) or the
//! WHATWG URL Standard's IPv4 parser would accept.
//!
//! `url::Url` already applies the WHATWG IPv4 parser to hosts of special
//! schemes (http, https), so a host that reaches us as a *domain* should never
//! be numeric. This module is the belt to that pair of braces: a domain host
//! that still parses as IPv4 here is treated as an IP literal, and one whose
//! last label merely *looks* numeric is refused as ambiguous.

use std::net::Ipv4Addr;

/// Splits `host` into dot-separated parts, dropping a single trailing empty
/// part (`"127.0.0.1."`), as the WHATWG IPv4 parser does.
fn parts(host: &str) -> Vec<&str> {
    let mut parts: Vec<&str> = host.split('.').collect();
    if parts.len() > 1 && parts.last() == Some(&"") {
        parts.pop();
    }
    parts
}

/// Parses one part: `0x`/`0X` prefix is hexadecimal (an empty remainder is 0),
/// a leading `0` is octal, otherwise decimal. Returns `None` on any invalid
/// digit or on overflow beyond `u32`.
fn parse_part(part: &str) -> Option<u64> {
    if part.is_empty() {
        return None;
    }
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        return Some(0);
    }
    let mut value: u64 = 0;
    for c in digits.chars() {
        let d = c.to_digit(radix)?;
        value = value.checked_mul(u64::from(radix))?.checked_add(u64::from(d))?;
        if value > u64::from(u32::MAX) {
            return None;
        }
    }
    Some(value)
}

/// Parses `host` as an IPv4 address in any classic notation: 1 to 4 parts,
/// each decimal, octal (leading `0`) or hexadecimal (`0x`), the last part
/// filling all remaining bytes (`127.1`, `2130706433`, `0x7f.0.0.1`,
/// `0177.0.0.1`, `0x7f000001`, mixed forms; an optional trailing dot).
pub(crate) fn parse_lenient(host: &str) -> Option<Ipv4Addr> {
    let parts = parts(host);
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        nums.push(parse_part(p)?);
    }
    let (last, init) = nums.split_last()?;
    if init.iter().any(|&n| n > 255) {
        return None;
    }
    let last_bits = 8 * (5 - parts.len() as u32);
    if last_bits < 64 && *last >= (1u64 << last_bits) {
        return None;
    }
    let mut value: u64 = *last;
    for (i, n) in init.iter().enumerate() {
        value += n << (8 * (3 - i as u32));
    }
    Some(Ipv4Addr::from(u32::try_from(value).ok()?))
}

/// True when the last label of `host` is a number in some notation
/// (WHATWG URL Standard "ends in a number"): such a host would be handed to
/// an IPv4 parser by other software, so it must not be treated as a name.
pub(crate) fn ends_in_number(host: &str) -> bool {
    let Some(last) = parts(host).pop() else {
        return false;
    };
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    last.strip_prefix("0x").or_else(|| last.strip_prefix("0X")).is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notations() {
        let lo = Some(Ipv4Addr::new(127, 0, 0, 1));
        for s in [
            "127.0.0.1",
            "127.0.0.1.",
            "2130706433",
            "0177.0.0.1",
            "0x7f.0.0.1",
            "0X7F.0.0.1",
            "0x7f000001",
            "017700000001",
            "127.1",
            "127.0.1",
            "0x7f.1",
            "0177.0x0.0.01",
            "0x7f.0x00.0x00.0x01",
            "00000177.0.0.1",
        ] {
            assert_eq!(parse_lenient(s), lo, "{s}");
        }
        assert_eq!(parse_lenient("10.1"), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(parse_lenient("0"), Some(Ipv4Addr::new(0, 0, 0, 0)));
        assert_eq!(parse_lenient("0x"), Some(Ipv4Addr::new(0, 0, 0, 0)));
        assert_eq!(parse_lenient("4294967295"), Some(Ipv4Addr::BROADCAST));
    }

    #[test]
    fn rejects_non_addresses() {
        for s in [
            "",
            ".",
            "example.com",
            "1.2.3.4.5",
            "256.0.0.1",
            "4294967296",
            "1.16777216",
            "08.0.0.1",
            "0x7g.0.0.1",
            "1..1",
            "99999999999999999999999",
        ] {
            assert_eq!(parse_lenient(s), None, "{s}");
        }
    }

    #[test]
    fn numeric_tail_detection() {
        assert!(ends_in_number("foo.123"));
        assert!(ends_in_number("foo.0x1f"));
        assert!(ends_in_number("1.2.3.4.5"));
        assert!(ends_in_number("09"));
        assert!(!ends_in_number("example.com"));
        assert!(!ends_in_number("123.example"));
        assert!(!ends_in_number("foo.0xg"));
    }
}
