//! Which IP addresses are public, from the IANA special-purpose address
//! registries (IPv4 and IPv6). Anything not globally reachable unicast is
//! non-public; an IPv4 address embedded in an IPv6 one (IPv4-mapped,
//! IPv4-compatible, NAT64's well-known prefix, 6to4) is judged as that IPv4
//! address, so a private target cannot hide behind a v6 form.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IPv4 address hidden in an IPv6 one is judged as the IPv4 address:
/// IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d` (deprecated),
/// NAT64 `64:ff9b::a.b.c.d`, and 6to4 `2002:aabb:ccdd::/48`.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    };
    // IPv4-compatible, but not `::` and `::1`, which are IPv6's own.
    if s[..6] == [0; 6] && (s[6] != 0 || s[7] > 1) {
        return v4(s[6], s[7]);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return v4(s[6], s[7]);
    }
    if s[0] == 0x2002 {
        return v4(s[1], s[2]);
    }
    ip
}

/// Whether `host` (as an operator wrote it: a name, or an address without
/// brackets) names the non-public address `ip` explicitly: `host` is that
/// address, or `localhost` and `ip` is loopback. What lets a grant, or a
/// registry's reference, reach a private address.
/// Whether `host`, as a URL writes it (`localhost`, `127.0.0.1`,
/// `[::1]`, `::ffff:127.0.0.1`), names this machine.
pub fn is_loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<IpAddr>()
            .is_ok_and(|ip| canonical(ip).is_loopback())
}

pub(crate) fn names_address(host: &str, ip: IpAddr) -> bool {
    if host == "localhost" {
        return canonical(ip).is_loopback();
    }
    host.parse::<IpAddr>()
        .is_ok_and(|named| canonical(named) == canonical(ip))
}

/// Whether `ip` is anything but a public unicast address.
pub fn is_non_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => v4_non_public(v4),
        IpAddr::V6(v6) => v6_non_public(v6),
    }
}

/// IPv4 blocks that are not globally reachable (IANA IPv4 Special-Purpose
/// Address Registry), plus multicast and the reserved 240/4.
const V4_BLOCKS: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),       // "this network"
    (Ipv4Addr::new(10, 0, 0, 0), 8),      // private
    (Ipv4Addr::new(100, 64, 0, 0), 10),   // shared address space (CGNAT)
    (Ipv4Addr::new(127, 0, 0, 0), 8),     // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16),  // link-local
    (Ipv4Addr::new(172, 16, 0, 0), 12),   // private
    (Ipv4Addr::new(192, 0, 0, 0), 24),    // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24),    // documentation (TEST-NET-1)
    (Ipv4Addr::new(192, 88, 99, 0), 24),  // 6to4 relay anycast (deprecated)
    (Ipv4Addr::new(192, 168, 0, 0), 16),  // private
    (Ipv4Addr::new(198, 18, 0, 0), 15),   // benchmarking
    (Ipv4Addr::new(198, 51, 100, 0), 24), // documentation (TEST-NET-2)
    (Ipv4Addr::new(203, 0, 113, 0), 24),  // documentation (TEST-NET-3)
    (Ipv4Addr::new(224, 0, 0, 0), 4),     // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4),     // reserved, and broadcast
];

/// IPv6 blocks that are not globally reachable (IANA IPv6 Special-Purpose
/// Address Registry), plus multicast and the deprecated site-local block.
/// The forms that embed IPv4 are judged by [`canonical`] first.
const V6_BLOCKS: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 128), // unspecified
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 1), 128), // loopback
    (Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48), // local-use NAT64
    (Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64), // discard-only
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23), // IETF protocol assignments (Teredo, ORCHID, ...)
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20), // documentation
    (Ipv6Addr::new(0x5f00, 0, 0, 0, 0, 0, 0, 0), 16), // segment routing SIDs
    (Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0), 7),  // unique local
    (Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10), // link-local
    (Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0), 10), // site-local (deprecated)
    (Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8),  // multicast
];

fn v4_non_public(ip: Ipv4Addr) -> bool {
    let ip = u32::from(ip);
    V4_BLOCKS.iter().any(|&(net, len)| {
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        ip & mask == u32::from(net) & mask
    })
}

fn v6_non_public(ip: Ipv6Addr) -> bool {
    let ip = u128::from(ip);
    V6_BLOCKS.iter().any(|&(net, len)| {
        let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
        ip & mask == u128::from(net) & mask
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per registry entry (and per embedding), each side of its
    /// edge where it has one.
    #[test]
    fn special_purpose_registries_both_families() {
        let table: &[(&str, bool)] = &[
            // IPv4
            ("0.1.2.3", false),
            ("10.0.0.1", false),
            ("100.64.0.1", false),
            ("100.127.255.255", false),
            ("100.128.0.1", true),
            ("127.0.0.1", false),
            ("127.1.2.3", false),
            ("169.254.169.254", false),
            ("172.16.0.1", false),
            ("172.31.255.255", false),
            ("172.32.0.1", true),
            ("192.0.0.1", false),
            ("192.0.0.170", false),
            ("192.0.1.1", true),
            ("192.0.2.1", false),
            ("192.88.99.1", false),
            ("192.168.1.1", false),
            ("198.18.0.1", false),
            ("198.19.255.255", false),
            ("198.20.0.1", true),
            ("198.51.100.7", false),
            ("203.0.113.9", false),
            ("224.0.0.1", false),
            ("239.255.255.250", false),
            ("240.0.0.1", false),
            ("255.255.255.255", false),
            ("1.1.1.1", true),
            ("8.8.8.8", true),
            ("93.184.216.34", true),
            // IPv6
            ("::", false),
            ("::1", false),
            ("::ffff:127.0.0.1", false),
            ("::ffff:10.1.2.3", false),
            ("::ffff:169.254.169.254", false),
            ("::ffff:8.8.8.8", true),
            ("::127.0.0.1", false),
            ("::10.0.0.1", false),
            ("::8.8.8.8", true),
            ("64:ff9b::a00:1", false),
            ("64:ff9b::808:808", true),
            ("64:ff9b:1::1", false),
            ("100::1", false),
            ("2001::1", false),
            ("2001:1ff::1", false),
            ("2001:200::1", true),
            ("2001:db8::1", false),
            ("2002:a00:1::1", false),
            ("2002:c0a8:101::1", false),
            ("2002:808:808::1", true),
            ("3fff::1", false),
            ("5f00::1", false),
            ("fc00::1", false),
            ("fd00::1", false),
            ("fe80::1", false),
            ("fec0::1", false),
            ("feff::1", false),
            ("ff02::1", false),
            ("2606:4700::1111", true),
            ("2a00:1450:4001::1", true),
        ];
        for &(text, public) in table {
            let ip: IpAddr = text.parse().unwrap();
            assert_eq!(
                !is_non_public(ip),
                public,
                "{text}: public should be {public}"
            );
        }
    }
}
