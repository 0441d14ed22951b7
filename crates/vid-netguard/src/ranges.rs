//! Special-purpose address tables and the "is this address globally
//! routable?" classification.
//!
//! The tables are written out by hand from the IANA special-purpose address
//! registries defined by RFC 6890 (and its updates RFC 8190), plus the other
//! RFCs cited per entry. They deliberately do not use the unstable
//! `IpAddr::is_global`.
//!
//! IPv4 is a deny-list: anything not in [`V4_TABLE`] is treated as global.
//! IPv6 is stricter: besides the deny-list, anything outside the global
//! unicast allocation `2000::/3` (RFC 4291 §2.4, RFC 3587) is refused, so
//! future or unlisted special ranges fail closed.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Why an address range is not globally routable.
///
/// Each kind carries a stable machine-readable [`code`](RangeKind::code) and a
/// human-readable [`description`](RangeKind::description); the defining RFC
/// of each concrete range is in [`SpecialRange::rfc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RangeKind {
    /// IPv4 `0.0.0.0/8`, "this network" (RFC 791, RFC 1122 §3.2.1.3).
    ThisNetwork,
    /// IPv4 `127.0.0.0/8` (RFC 1122 §3.2.1.3) and IPv6 `::1/128` (RFC 4291 §2.5.3).
    Loopback,
    /// IPv4 `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16` (RFC 1918).
    Private,
    /// IPv4 `100.64.0.0/10`, shared address space / carrier-grade NAT (RFC 6598).
    SharedAddressSpace,
    /// IPv4 `169.254.0.0/16` (RFC 3927), which includes the cloud metadata
    /// endpoint `169.254.169.254`; IPv6 `fe80::/10` (RFC 4291 §2.5.6).
    LinkLocal,
    /// IPv4 `192.0.0.0/24`, IETF protocol assignments (RFC 6890 §2.2.2).
    Ipv4ProtocolAssignments,
    /// Documentation ranges: IPv4 TEST-NET-1/2/3 `192.0.2.0/24`,
    /// `198.51.100.0/24`, `203.0.113.0/24` (RFC 5737); IPv6 `2001:db8::/32`
    /// (RFC 3849) and `3fff::/20` (RFC 9637).
    Documentation,
    /// IPv4 `198.18.0.0/15`, network device benchmarking (RFC 2544).
    Benchmarking,
    /// IPv4 `192.88.99.0/24`, 6to4 relay anycast (RFC 3068, deprecated by RFC 7526).
    SixToFourRelayAnycast,
    /// IPv4 `224.0.0.0/4` (RFC 5771) and IPv6 `ff00::/8` (RFC 4291 §2.7).
    Multicast,
    /// IPv4 `240.0.0.0/4`, reserved for future use (RFC 1112 §4).
    Reserved,
    /// IPv4 `255.255.255.255/32`, limited broadcast (RFC 919, RFC 8190).
    Broadcast,
    /// IPv6 `::/128`, the unspecified address (RFC 4291 §2.5.2).
    Unspecified,
    /// IPv6 `fc00::/7`, unique local addresses (RFC 4193).
    UniqueLocal,
    /// IPv6 `fec0::/10`, site-local (deprecated by RFC 3879).
    SiteLocal,
    /// IPv6 `::/96`, IPv4-compatible addresses (deprecated, RFC 4291 §2.5.5.1).
    /// Always refused, whatever IPv4 address is embedded.
    Ipv4Compatible,
    /// IPv6 `64:ff9b:1::/48`, local-use IPv4/IPv6 translation (RFC 8215).
    Nat64LocalUse,
    /// IPv6 `2001::/32`, Teredo tunnelling (RFC 4380).
    Teredo,
    /// IPv6 `2001::/23`, IETF protocol assignments (RFC 2928, RFC 6890 §2.2.3).
    Ipv6ProtocolAssignments,
    /// IPv6 `100::/64`, discard-only prefix (RFC 6666).
    Discard,
    /// IPv6 outside the global unicast allocation `2000::/3`
    /// (RFC 4291 §2.4, RFC 3587; IANA IPv6 Address Space registry).
    NotGlobalUnicast,
}

impl RangeKind {
    /// Stable, machine-readable identifier (snake_case) for API responses,
    /// metrics and logs.
    pub const fn code(self) -> &'static str {
        match self {
            RangeKind::ThisNetwork => "this_network",
            RangeKind::Loopback => "loopback",
            RangeKind::Private => "private",
            RangeKind::SharedAddressSpace => "shared_address_space",
            RangeKind::LinkLocal => "link_local",
            RangeKind::Ipv4ProtocolAssignments => "ipv4_protocol_assignments",
            RangeKind::Documentation => "documentation",
            RangeKind::Benchmarking => "benchmarking",
            RangeKind::SixToFourRelayAnycast => "6to4_relay_anycast",
            RangeKind::Multicast => "multicast",
            RangeKind::Reserved => "reserved",
            RangeKind::Broadcast => "broadcast",
            RangeKind::Unspecified => "unspecified",
            RangeKind::UniqueLocal => "unique_local",
            RangeKind::SiteLocal => "site_local",
            RangeKind::Ipv4Compatible => "ipv4_compatible",
            RangeKind::Nat64LocalUse => "nat64_local_use",
            RangeKind::Teredo => "teredo",
            RangeKind::Ipv6ProtocolAssignments => "ipv6_protocol_assignments",
            RangeKind::Discard => "discard",
            RangeKind::NotGlobalUnicast => "not_global_unicast",
        }
    }

    /// Human-readable description, phrased to follow "`<address> is …`".
    pub const fn description(self) -> &'static str {
        match self {
            RangeKind::ThisNetwork => "in the \"this network\" block",
            RangeKind::Loopback => "loopback",
            RangeKind::Private => "private-use",
            RangeKind::SharedAddressSpace => "shared address space (carrier-grade NAT)",
            RangeKind::LinkLocal => "link-local (includes cloud metadata endpoints)",
            RangeKind::Ipv4ProtocolAssignments => "reserved for IETF protocol assignments",
            RangeKind::Documentation => "reserved for documentation",
            RangeKind::Benchmarking => "reserved for benchmarking",
            RangeKind::SixToFourRelayAnycast => "6to4 relay anycast (deprecated)",
            RangeKind::Multicast => "multicast",
            RangeKind::Reserved => "reserved for future use",
            RangeKind::Broadcast => "the limited broadcast address",
            RangeKind::Unspecified => "the unspecified address",
            RangeKind::UniqueLocal => "unique local (private IPv6)",
            RangeKind::SiteLocal => "site-local (deprecated)",
            RangeKind::Ipv4Compatible => "an IPv4-compatible IPv6 address (deprecated)",
            RangeKind::Nat64LocalUse => "a local-use NAT64 translation address",
            RangeKind::Teredo => "a Teredo tunnelling address",
            RangeKind::Ipv6ProtocolAssignments => "reserved for IETF protocol assignments",
            RangeKind::Discard => "in the discard-only prefix",
            RangeKind::NotGlobalUnicast => "outside IPv6 global unicast space",
        }
    }
}

impl fmt::Display for RangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// An IPv6 form that carries an IPv4 address inside it. The embedded IPv4
/// address is extracted and checked like any other IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Embedding {
    /// `::ffff:0:0/96`, IPv4-mapped (RFC 4291 §2.5.5.2). On a dual-stack
    /// socket this *is* the IPv4 address.
    Ipv4Mapped,
    /// `64:ff9b::/96`, NAT64 well-known prefix (RFC 6052). A translator
    /// forwards it to the embedded IPv4 address.
    Nat64,
    /// `2002::/16`, 6to4 (RFC 3056). Bits 16..48 hold an IPv4 address.
    SixToFour,
}

impl Embedding {
    /// Stable, machine-readable identifier.
    pub const fn code(self) -> &'static str {
        match self {
            Embedding::Ipv4Mapped => "ipv4_mapped",
            Embedding::Nat64 => "nat64",
            Embedding::SixToFour => "6to4",
        }
    }

    /// Human-readable description, phrased to follow "`<address> is …`".
    pub const fn description(self) -> &'static str {
        match self {
            Embedding::Ipv4Mapped => "an IPv4-mapped IPv6 address",
            Embedding::Nat64 => "a NAT64 address",
            Embedding::SixToFour => "a 6to4 address",
        }
    }

    /// The RFC defining the embedding.
    pub const fn rfc(self) -> &'static str {
        match self {
            Embedding::Ipv4Mapped => "RFC 4291",
            Embedding::Nat64 => "RFC 6052",
            Embedding::SixToFour => "RFC 3056",
        }
    }

    /// The prefix this embedding lives in.
    pub const fn prefix(self) -> Ipv6Net {
        match self {
            Embedding::Ipv4Mapped => IPV4_MAPPED,
            Embedding::Nat64 => NAT64_WKP,
            Embedding::SixToFour => SIX_TO_FOUR,
        }
    }
}

/// One row of the special-purpose address tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpecialRange {
    /// The network.
    pub net: IpNet,
    /// Why it is refused.
    pub kind: RangeKind,
    /// The RFC (and section) that defines it.
    pub rfc: &'static str,
}

/// An address refused by the policy, with the reason.
///
/// `Display` gives a sentence suitable for an API problem detail, e.g.
/// `127.0.0.1 is loopback (127.0.0.0/8, RFC 1122)` or
/// `::ffff:7f00:1 is an IPv4-mapped IPv6 address (RFC 4291) embedding 127.0.0.1, which is loopback (127.0.0.0/8, RFC 1122)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockedAddress {
    /// The address that was refused, exactly as checked.
    pub address: IpAddr,
    /// The special-purpose range that caused the refusal. For embedded forms
    /// this is the range of the *embedded IPv4* address.
    pub range: SpecialRange,
    /// Set when `address` is an IPv6 form embedding an IPv4 address and it
    /// was refused because of the embedded address.
    pub embedded: Option<(Embedding, Ipv4Addr)>,
}

impl BlockedAddress {
    /// Why the address was refused.
    pub fn kind(&self) -> RangeKind {
        self.range.kind
    }

    /// Stable machine-readable category of the refusal ([`RangeKind::code`]).
    pub fn category(&self) -> &'static str {
        self.range.kind.code()
    }
}

impl fmt::Display for BlockedAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.range;
        match self.embedded {
            Some((via, v4)) => write!(
                f,
                "{} is {} ({}) embedding {}, which is {} ({}, {})",
                self.address,
                via.description(),
                via.rfc(),
                v4,
                r.kind.description(),
                r.net,
                r.rfc
            ),
            None => write!(f, "{} is {} ({}, {})", self.address, r.kind.description(), r.net, r.rfc),
        }
    }
}

impl std::error::Error for BlockedAddress {}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

#[allow(clippy::too_many_arguments)]
const fn v6(a: u16, b: u16, c: u16, d: u16, e: u16, f: u16, g: u16, h: u16, len: u8) -> Ipv6Net {
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, c, d, e, f, g, h), len)
}

const fn r4(net: Ipv4Net, kind: RangeKind, rfc: &'static str) -> SpecialRange {
    SpecialRange { net: IpNet::V4(net), kind, rfc }
}

const fn r6(net: Ipv6Net, kind: RangeKind, rfc: &'static str) -> SpecialRange {
    SpecialRange { net: IpNet::V6(net), kind, rfc }
}

/// IPv4 special-purpose ranges that are refused, first match wins
/// (RFC 6890 §2.2.2, updated by RFC 8190; IANA IPv4 Special-Purpose Address
/// Registry). The IANA entries marked "globally reachable" (e.g. AS112
/// `192.31.196.0/24` RFC 7535, AMT `192.52.193.0/24` RFC 7450) are
/// intentionally not listed.
pub const V4_TABLE: &[SpecialRange] = &[
    // Limited broadcast. Before 240/4 for a precise message.
    r4(v4(255, 255, 255, 255, 32), RangeKind::Broadcast, "RFC 919, RFC 8190"),
    // "This host on this network"; connecting to 0.0.0.0 reaches localhost on Linux.
    r4(v4(0, 0, 0, 0, 8), RangeKind::ThisNetwork, "RFC 1122 §3.2.1.3"),
    r4(v4(10, 0, 0, 0, 8), RangeKind::Private, "RFC 1918"),
    // Shared address space (CGNAT); also e.g. Alibaba Cloud metadata 100.100.100.200.
    r4(v4(100, 64, 0, 0, 10), RangeKind::SharedAddressSpace, "RFC 6598"),
    r4(v4(127, 0, 0, 0, 8), RangeKind::Loopback, "RFC 1122"),
    // Link-local; 169.254.169.254 is the AWS/GCP/Azure metadata service.
    r4(v4(169, 254, 0, 0, 16), RangeKind::LinkLocal, "RFC 3927"),
    r4(v4(172, 16, 0, 0, 12), RangeKind::Private, "RFC 1918"),
    // IETF protocol assignments (DS-Lite, PCP/TURN anycast, NAT64 discovery...).
    r4(v4(192, 0, 0, 0, 24), RangeKind::Ipv4ProtocolAssignments, "RFC 6890 §2.2.2"),
    // TEST-NET-1.
    r4(v4(192, 0, 2, 0, 24), RangeKind::Documentation, "RFC 5737"),
    // 6to4 relay anycast, deprecated.
    r4(v4(192, 88, 99, 0, 24), RangeKind::SixToFourRelayAnycast, "RFC 3068, RFC 7526"),
    r4(v4(192, 168, 0, 0, 16), RangeKind::Private, "RFC 1918"),
    r4(v4(198, 18, 0, 0, 15), RangeKind::Benchmarking, "RFC 2544"),
    // TEST-NET-2.
    r4(v4(198, 51, 100, 0, 24), RangeKind::Documentation, "RFC 5737"),
    // TEST-NET-3.
    r4(v4(203, 0, 113, 0, 24), RangeKind::Documentation, "RFC 5737"),
    r4(v4(224, 0, 0, 0, 4), RangeKind::Multicast, "RFC 5771"),
    // Class E.
    r4(v4(240, 0, 0, 0, 4), RangeKind::Reserved, "RFC 1112 §4"),
];

const IPV4_MAPPED: Ipv6Net = v6(0, 0, 0, 0, 0, 0xffff, 0, 0, 96);
const NAT64_WKP: Ipv6Net = v6(0x64, 0xff9b, 0, 0, 0, 0, 0, 0, 96);
const SIX_TO_FOUR: Ipv6Net = v6(0x2002, 0, 0, 0, 0, 0, 0, 0, 16);

/// The IPv6 global unicast allocation (RFC 4291 §2.4, RFC 3587). IPv6
/// addresses outside it are refused as [`RangeKind::NotGlobalUnicast`].
pub const GLOBAL_UNICAST: SpecialRange = r6(v6(0x2000, 0, 0, 0, 0, 0, 0, 0, 3), RangeKind::NotGlobalUnicast, "RFC 4291 §2.4");

/// IPv6 special-purpose ranges that are refused outright, first match wins
/// (RFC 6890 §2.2.3; IANA IPv6 Special-Purpose Address Registry). The
/// embedding prefixes `::ffff:0:0/96`, `64:ff9b::/96` and `2002::/16` are not
/// here: they are decided by their embedded IPv4 address (see [`Embedding`]).
/// Anything else outside `2000::/3` is refused as
/// [`RangeKind::NotGlobalUnicast`] (see [`GLOBAL_UNICAST`]).
pub const V6_TABLE: &[SpecialRange] = &[
    r6(v6(0, 0, 0, 0, 0, 0, 0, 0, 128), RangeKind::Unspecified, "RFC 4291 §2.5.2"),
    r6(v6(0, 0, 0, 0, 0, 0, 0, 1, 128), RangeKind::Loopback, "RFC 4291 §2.5.3"),
    // IPv4-compatible, deprecated; never routed today.
    r6(v6(0, 0, 0, 0, 0, 0, 0, 0, 96), RangeKind::Ipv4Compatible, "RFC 4291 §2.5.5.1"),
    // Local-use IPv4/IPv6 translation; the embedding format is operator-defined.
    r6(v6(0x64, 0xff9b, 1, 0, 0, 0, 0, 0, 48), RangeKind::Nat64LocalUse, "RFC 8215"),
    r6(v6(0x100, 0, 0, 0, 0, 0, 0, 0, 64), RangeKind::Discard, "RFC 6666"),
    // Teredo: the client address is obfuscated inside; refuse all.
    r6(v6(0x2001, 0, 0, 0, 0, 0, 0, 0, 32), RangeKind::Teredo, "RFC 4380"),
    // IETF protocol assignments (benchmarking 2001:2::/48, ORCHID, AMT,
    // AS112 ...). None is a legitimate webhook destination.
    r6(v6(0x2001, 0, 0, 0, 0, 0, 0, 0, 23), RangeKind::Ipv6ProtocolAssignments, "RFC 2928, RFC 6890 §2.2.3"),
    r6(v6(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0, 32), RangeKind::Documentation, "RFC 3849"),
    r6(v6(0x3fff, 0, 0, 0, 0, 0, 0, 0, 20), RangeKind::Documentation, "RFC 9637"),
    // Unique local (also AWS IMDS over IPv6, fd00:ec2::254).
    r6(v6(0xfc00, 0, 0, 0, 0, 0, 0, 0, 7), RangeKind::UniqueLocal, "RFC 4193"),
    r6(v6(0xfe80, 0, 0, 0, 0, 0, 0, 0, 10), RangeKind::LinkLocal, "RFC 4291 §2.5.6"),
    r6(v6(0xfec0, 0, 0, 0, 0, 0, 0, 0, 10), RangeKind::SiteLocal, "RFC 3879"),
    r6(v6(0xff00, 0, 0, 0, 0, 0, 0, 0, 8), RangeKind::Multicast, "RFC 4291 §2.7"),
];

fn find(table: &'static [SpecialRange], ip: IpAddr) -> Option<SpecialRange> {
    table.iter().copied().find(|r| r.net.contains(&ip))
}

/// Extracts the IPv4 address embedded in an IPv6 address, if it is one of
/// the [`Embedding`] forms.
pub fn embedded_ipv4(ip: Ipv6Addr) -> Option<(Embedding, Ipv4Addr)> {
    let o = ip.octets();
    if IPV4_MAPPED.contains(&ip) {
        Some((Embedding::Ipv4Mapped, Ipv4Addr::new(o[12], o[13], o[14], o[15])))
    } else if NAT64_WKP.contains(&ip) {
        Some((Embedding::Nat64, Ipv4Addr::new(o[12], o[13], o[14], o[15])))
    } else if SIX_TO_FOUR.contains(&ip) {
        Some((Embedding::SixToFour, Ipv4Addr::new(o[2], o[3], o[4], o[5])))
    } else {
        None
    }
}

/// Checks that `ip` is globally routable, **ignoring any allow-list**
/// (use [`AddressPolicy::check_ip`](crate::AddressPolicy::check_ip) for that).
///
/// Decisions for IPv6 forms embedding IPv4 (see [`Embedding`]):
/// * IPv4-mapped `::ffff:a.b.c.d` (RFC 4291), NAT64 `64:ff9b::a.b.c.d`
///   (RFC 6052) and 6to4 `2002:AABB:CCDD::/48` (RFC 3056) are refused iff
///   the embedded IPv4 address is refused. With a global IPv4 inside they
///   are accepted: a mapped address *is* that IPv4 host, and NAT64/6to4
///   gateways are how IPv6-only networks reach a global IPv4 host (RFC 6052
///   §3.1 forbids translating non-global IPv4 with the well-known prefix).
/// * IPv4-compatible `::a.b.c.d` (deprecated, RFC 4291 §2.5.5.1), local-use
///   NAT64 `64:ff9b:1::/48` (RFC 8215) and Teredo `2001::/32` (RFC 4380) are
///   always refused, whatever they embed.
pub fn check_global(ip: IpAddr) -> Result<(), BlockedAddress> {
    let blocked = |range, embedded| BlockedAddress { address: ip, range, embedded };
    match ip {
        IpAddr::V4(_) => match find(V4_TABLE, ip) {
            None => Ok(()),
            Some(range) => Err(blocked(range, None)),
        },
        IpAddr::V6(v6) => {
            if let Some((via, inner)) = embedded_ipv4(v6) {
                return match find(V4_TABLE, IpAddr::V4(inner)) {
                    None => Ok(()),
                    Some(range) => Err(blocked(range, Some((via, inner)))),
                };
            }
            if let Some(range) = find(V6_TABLE, ip) {
                return Err(blocked(range, None));
            }
            if !GLOBAL_UNICAST.net.contains(&ip) {
                return Err(blocked(GLOBAL_UNICAST, None));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_normalised_networks() {
        for r in V4_TABLE.iter().chain(V6_TABLE).chain([&GLOBAL_UNICAST]) {
            assert_eq!(r.net.addr(), r.net.network(), "{} has host bits set", r.net);
            assert!(r.rfc.starts_with("RFC "), "{} lacks an RFC", r.net);
        }
    }

    #[test]
    fn six_to_four_extracts_bits_16_to_48() {
        let ip: Ipv6Addr = "2002:c0a8:0101::1".parse().unwrap();
        assert_eq!(embedded_ipv4(ip), Some((Embedding::SixToFour, Ipv4Addr::new(192, 168, 1, 1))));
    }

    #[test]
    fn codes_are_unique() {
        use RangeKind::*;
        let all = [
            ThisNetwork,
            Loopback,
            Private,
            SharedAddressSpace,
            LinkLocal,
            Ipv4ProtocolAssignments,
            Documentation,
            Benchmarking,
            SixToFourRelayAnycast,
            Multicast,
            Reserved,
            Broadcast,
            Unspecified,
            UniqueLocal,
            SiteLocal,
            Ipv4Compatible,
            Nat64LocalUse,
            Teredo,
            Ipv6ProtocolAssignments,
            Discard,
            NotGlobalUnicast,
        ];
        let mut codes: Vec<_> = all.iter().map(|k| k.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
    }
}
