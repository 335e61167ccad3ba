//! Destination policy: which hosts and addresses Starbridge may send a request to on a user's
//! behalf: the server's webhook deliveries and the worker's HTTP executor.
//!
//! A URL given through the API must not turn the server into a way into its own network
//! (server-side request forgery) or into a scanner of it. So by default a destination is
//! refused when its address is
//!
//! - unspecified or "this network" (`0.0.0.0/8`, `::`: connecting there reaches this host),
//! - loopback (`127.0.0.0/8`, `::1`),
//! - private (`10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`), shared / carrier-grade NAT
//!   (`100.64.0.0/10`), unique local (`fc00::/7`) or site-local (`fec0::/10`),
//! - link-local (`169.254.0.0/16`, where cloud metadata services answer; `fe80::/10`),
//! - multicast (`224.0.0.0/4`, `ff00::/8`), the broadcast address or reserved (`240.0.0.0/4`),
//! - a local-use NAT64 address (`64:ff9b:1::/48`, whose IPv4 mapping only its network knows),
//!
//! - a cloud metadata service's address (`169.254.169.254`, `fd00:ec2::254`, `100.100.100.200`:
//!   they hand out the host's cloud credentials),
//!
//! or an IPv6 address that carries one of those IPv4 addresses: IPv4-mapped (`::ffff:a.b.c.d`),
//! IPv4-translated (`::ffff:0:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), 6to4 (`2002:AABB:CCDD::/48`)
//! and NAT64 (`64:ff9b::a.b.c.d`); and when its host is `localhost` or a name under `.localhost`,
//! which are refused without asking DNS.
//!
//! The HTTP executor calls a team's internal services, so its policy
//! ([`DestinationPolicy::private_network`]) also permits the private, shared, unique local and
//! site-local ranges; everything else above stays refused.
//!
//! The operator opens chosen destinations with [`Allow`] entries (the server's `--webhook-allow`,
//! the worker's `--http-allow`):
//! a CIDR block, an address, or a host name (`*.example.com` for the names under it). A host name
//! allowed this way may resolve to any address; any other name is checked address by address.
//!
//! The policy is pure: callers resolve names themselves and check each address they would connect
//! to ([`DestinationPolicy::check_ip`]) after resolution, on every new connection (a name may
//! resolve elsewhere the next time: DNS rebinding), and follow no redirect unchecked. URLs are read
//! with the WHATWG parser (the `url` crate, which HTTP clients use), so numeric spellings such as
//! `http://2130706433/` or `http://0x7f.1/` are the IPv4 address they denote to the client too.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

pub use url::Url;

/// Why a destination is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `0.0.0.0/8` or `::`.
    Unspecified,
    /// `127.0.0.0/8` or `::1`.
    Loopback,
    /// `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`.
    Private,
    /// `100.64.0.0/10`, carrier-grade NAT.
    Shared,
    /// `169.254.0.0/16` (cloud metadata services) or `fe80::/10`.
    LinkLocal,
    /// `fc00::/7`.
    UniqueLocal,
    /// `fec0::/10` (deprecated, still routed inside some networks).
    SiteLocal,
    /// `224.0.0.0/4` or `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `240.0.0.0/4` but the broadcast address.
    Reserved,
    /// `64:ff9b:1::/48`.
    LocalNat64,
    /// `localhost` or a name under `.localhost`.
    LocalName,
    /// A cloud metadata service: `169.254.169.254`, `fd00:ec2::254`, `100.100.100.200`.
    Metadata,
}

impl Reason {
    /// What the destination is, as a noun phrase: "a loopback address".
    pub fn describe(self) -> &'static str {
        match self {
            Reason::Unspecified => "an unspecified address (it reaches this host)",
            Reason::Loopback => "a loopback address",
            Reason::Private => "a private address",
            Reason::Shared => "a shared (carrier-grade NAT) address",
            Reason::LinkLocal => "a link-local address",
            Reason::UniqueLocal => "a unique local address",
            Reason::SiteLocal => "a site-local address",
            Reason::Multicast => "a multicast address",
            Reason::Broadcast => "the broadcast address",
            Reason::Reserved => "a reserved address",
            Reason::LocalNat64 => "a local-use NAT64 address",
            Reason::LocalName => "a name of this host",
            Reason::Metadata => "a cloud metadata service's address",
        }
    }
}

/// An IPv6 form that carries an IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Embedding {
    /// `::ffff:a.b.c.d`.
    Mapped,
    /// `::ffff:0:a.b.c.d`.
    Translated,
    /// `::a.b.c.d`.
    Compatible,
    /// `2002:AABB:CCDD::/48`.
    SixToFour,
    /// `64:ff9b::a.b.c.d`.
    Nat64,
}

impl Embedding {
    fn name(self) -> &'static str {
        match self {
            Embedding::Mapped => "IPv4-mapped",
            Embedding::Translated => "IPv4-translated",
            Embedding::Compatible => "IPv4-compatible",
            Embedding::SixToFour => "6to4",
            Embedding::Nat64 => "NAT64",
        }
    }
}

/// A refused destination: the host or address, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The host name or address refused, as written by [`IpAddr`]'s `Display` for addresses.
    pub destination: String,
    pub reason: Reason,
    /// The IPv4 address an IPv6 one carries, when that is what is refused.
    pub embedded: Option<(Embedding, Ipv4Addr)>,
}

impl Refusal {
    /// What the destination is: "a loopback address", "the IPv4-mapped form of 127.0.0.1, a
    /// loopback address".
    pub fn what(&self) -> String {
        match self.embedded {
            None => self.reason.describe().to_owned(),
            Some((form, v4)) => format!(
                "the {} form of {v4}, {}",
                form.name(),
                self.reason.describe()
            ),
        }
    }
}

/// "127.0.0.1 is a loopback address".
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is {}", self.destination, self.what())
    }
}

impl std::error::Error for Refusal {}

/// What to do with a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Connect: a permitted address, or a name an [`Allow`] entry opens (whatever it resolves to).
    Allowed,
    /// Do not connect.
    Refused(Refusal),
    /// A name: resolve it and check every address with [`DestinationPolicy::check_ip`].
    Resolve,
}

/// A block of addresses: `10.0.0.0/8`, `::1/128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    base: IpAddr,
    prefix: u8,
}

impl Block {
    fn contains(self, ip: IpAddr) -> bool {
        match (self.base, ip) {
            (IpAddr::V4(base), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(base) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(base), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(base) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// One destination an operator opens: a CIDR block, an address, a host name, or the names under
/// a domain (`*.example.com`). Parsed from text with [`FromStr`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow(AllowKind);

#[derive(Debug, Clone, PartialEq, Eq)]
enum AllowKind {
    Block(Block),
    Host(String),
    /// The domain, without the `*.`: names that end with `.<domain>`.
    Under(String),
}

/// Why an [`Allow`] entry cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{entry}' {problem}")]
pub struct AllowError {
    pub entry: String,
    pub problem: String,
}

impl FromStr for Allow {
    type Err = AllowError;

    fn from_str(text: &str) -> Result<Allow, AllowError> {
        let entry = text.trim();
        let refuse = |problem: &str| AllowError {
            entry: entry.to_owned(),
            problem: problem.to_owned(),
        };
        if entry.is_empty() {
            return Err(refuse(
                "is empty: give a CIDR block, an address or a host name",
            ));
        }
        if entry.contains("://") {
            return Err(refuse(
                "is a URL: give a CIDR block, an address or a host name",
            ));
        }
        if let Some((address, prefix)) = entry.split_once('/') {
            let base = parse_ip(address)
                .ok_or_else(|| refuse("is not a CIDR block: the part before '/' is no address"))?;
            let max = if base.is_ipv4() { 32 } else { 128 };
            let prefix = prefix
                .parse::<u8>()
                .ok()
                .filter(|prefix| *prefix <= max)
                .ok_or_else(|| {
                    refuse(&format!(
                        "is not a CIDR block: the prefix length must be 0 to {max}"
                    ))
                })?;
            let block = Block { base, prefix };
            let network = network_of(block);
            if network != base {
                return Err(refuse(&format!(
                    "has bits set past its prefix length: did you mean {network}/{prefix}?"
                )));
            }
            return Ok(Allow(AllowKind::Block(block)));
        }
        if let Some(ip) = parse_ip(entry) {
            return Ok(Allow(AllowKind::Block(single(ip))));
        }
        let (under, name) = match entry.strip_prefix("*.") {
            Some(domain) => (true, domain),
            None => (false, entry),
        };
        // The WHATWG host parser, as for URLs: a numeric spelling is the address it denotes, and
        // names are lowercased and turned to ASCII the way a URL's host is.
        match url::Host::parse(name) {
            Ok(url::Host::Ipv4(ip)) if !under => Ok(Allow(AllowKind::Block(single(ip.into())))),
            Ok(url::Host::Ipv6(ip)) if !under => Ok(Allow(AllowKind::Block(single(ip.into())))),
            Ok(url::Host::Domain(domain)) => {
                let domain = domain.trim_end_matches('.');
                let valid = !domain.is_empty()
                    && domain.split('.').all(|label| {
                        !label.is_empty()
                            && label
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                    });
                if !valid {
                    return Err(refuse("is not a host name"));
                }
                let domain = domain.to_owned();
                Ok(Allow(if under {
                    AllowKind::Under(domain)
                } else {
                    AllowKind::Host(domain)
                }))
            }
            Ok(_) => Err(refuse(
                "puts '*.' before an address: '*.' goes before a domain name",
            )),
            Err(error) => Err(refuse(&format!("is not a host name ({error})"))),
        }
    }
}

impl fmt::Display for Allow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            AllowKind::Block(block) => write!(f, "{}/{}", block.base, block.prefix),
            AllowKind::Host(name) => f.write_str(name),
            AllowKind::Under(domain) => write!(f, "*.{domain}"),
        }
    }
}

/// An address, bare or in brackets (`[::1]`).
fn parse_ip(text: &str) -> Option<IpAddr> {
    let text = text
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or(text);
    text.parse().ok()
}

fn single(ip: IpAddr) -> Block {
    Block {
        base: ip,
        prefix: if ip.is_ipv4() { 32 } else { 128 },
    }
}

/// The block's first address.
fn network_of(block: Block) -> IpAddr {
    match block.base {
        IpAddr::V4(base) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(block.prefix))
                .unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(base) & mask))
        }
        IpAddr::V6(base) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(block.prefix))
                .unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(base) & mask))
        }
    }
}

/// A host name as compared: lowercase, without a final dot.
fn normal_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Why an IPv4 address is refused by default, if it is.
fn v4_reason(ip: Ipv4Addr) -> Option<Reason> {
    Some(match ip.octets() {
        [169, 254, 169, 254] | [100, 100, 100, 200] => Reason::Metadata,
        [0, ..] => Reason::Unspecified,
        [127, ..] => Reason::Loopback,
        [10, ..] | [172, 16..=31, ..] | [192, 168, ..] => Reason::Private,
        [100, 64..=127, ..] => Reason::Shared,
        [169, 254, ..] => Reason::LinkLocal,
        [224..=239, ..] => Reason::Multicast,
        [255, 255, 255, 255] => Reason::Broadcast,
        [240..=255, ..] => Reason::Reserved,
        _ => return None,
    })
}

/// Why an IPv6 address is refused by default for itself (not for an IPv4 address it carries).
fn v6_reason(ip: Ipv6Addr) -> Option<Reason> {
    let first = ip.segments()[0];
    Some(if ip.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] {
        Reason::Metadata
    } else if ip.is_unspecified() {
        Reason::Unspecified
    } else if ip.is_loopback() {
        Reason::Loopback
    } else if first & 0xffc0 == 0xfe80 {
        Reason::LinkLocal
    } else if first & 0xffc0 == 0xfec0 {
        Reason::SiteLocal
    } else if first & 0xfe00 == 0xfc00 {
        Reason::UniqueLocal
    } else if first & 0xff00 == 0xff00 {
        Reason::Multicast
    } else if ip.segments()[..3] == [0x64, 0xff9b, 1] {
        Reason::LocalNat64
    } else {
        return None;
    })
}

/// The IPv4 address an IPv6 one carries, and how.
fn embedded_v4(ip: Ipv6Addr) -> Option<(Embedding, Ipv4Addr)> {
    let s = ip.segments();
    let [.., a, b, c, d] = ip.octets();
    let last = Ipv4Addr::new(a, b, c, d);
    let form = match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Embedding::Mapped,
        [0, 0, 0, 0, 0xffff, 0, _, _] => Embedding::Translated,
        [0, 0, 0, 0, 0, 0, _, _] => Embedding::Compatible,
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Embedding::Nat64,
        [0x2002, high, low, ..] => {
            let [a, b] = high.to_be_bytes();
            let [c, d] = low.to_be_bytes();
            return Some((Embedding::SixToFour, Ipv4Addr::new(a, b, c, d)));
        }
        _ => return None,
    };
    Some((form, last))
}

/// Which destinations are refused: the default ranges (see the module), less what the operator
/// allows. `DestinationPolicy::default()` allows nothing more.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationPolicy {
    allowed: Vec<Allow>,
    /// The private, shared, unique local and site-local ranges are permitted.
    private_network: bool,
}

impl DestinationPolicy {
    /// The default policy, opened by these entries.
    pub fn new(allowed: impl IntoIterator<Item = Allow>) -> DestinationPolicy {
        DestinationPolicy {
            allowed: allowed.into_iter().collect(),
            private_network: false,
        }
    }

    /// This policy, also permitting the private network's ranges (private, shared, unique local,
    /// site-local): the HTTP executor's, which calls a team's internal services. Loopback,
    /// unspecified, link-local, metadata and the other refused ranges stay refused.
    pub fn private_network(mut self) -> DestinationPolicy {
        self.private_network = true;
        self
    }

    /// Whether this policy refuses addresses for `reason` (unless an entry opens them).
    fn refuses(&self, reason: Reason) -> bool {
        !(self.private_network
            && matches!(
                reason,
                Reason::Private | Reason::Shared | Reason::UniqueLocal | Reason::SiteLocal
            ))
    }

    /// The default policy, opened by these entries written as text.
    pub fn allowing<S: AsRef<str>>(
        entries: impl IntoIterator<Item = S>,
    ) -> Result<DestinationPolicy, AllowError> {
        let allowed = entries
            .into_iter()
            .map(|entry| entry.as_ref().parse())
            .collect::<Result<Vec<Allow>, _>>()?;
        Ok(DestinationPolicy::new(allowed))
    }

    /// The entries that open destinations, in the order given.
    pub fn allowed(&self) -> &[Allow] {
        &self.allowed
    }

    fn blocks(&self) -> impl Iterator<Item = Block> + '_ {
        self.allowed.iter().filter_map(|allow| match allow.0 {
            AllowKind::Block(block) => Some(block),
            _ => None,
        })
    }

    /// Whether a connection to `ip` is permitted: an allowed block holds it (or the IPv4 address
    /// it carries), or it is in none of the refused ranges.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refusal> {
        let embedded = match ip {
            IpAddr::V4(_) => None,
            IpAddr::V6(v6) => embedded_v4(v6),
        };
        if self.blocks().any(|block| {
            block.contains(ip) || embedded.is_some_and(|(_, v4)| block.contains(IpAddr::V4(v4)))
        }) {
            return Ok(());
        }
        let refusal = |reason, embedded| Refusal {
            destination: ip.to_string(),
            reason,
            embedded,
        };
        let own = match ip {
            IpAddr::V4(v4) => v4_reason(v4),
            IpAddr::V6(v6) => v6_reason(v6),
        };
        if let Some(reason) = own.filter(|reason| self.refuses(*reason)) {
            return Err(refusal(reason, None));
        }
        if let Some((form, v4)) = embedded
            && let Some(reason) = v4_reason(v4).filter(|reason| self.refuses(*reason))
        {
            return Err(refusal(reason, Some((form, v4))));
        }
        Ok(())
    }

    /// Whether an entry opens this host name (whatever it resolves to).
    pub fn allows_name(&self, name: &str) -> bool {
        let name = normal_name(name);
        self.allowed.iter().any(|allow| match &allow.0 {
            AllowKind::Host(host) => *host == name,
            AllowKind::Under(domain) => name
                .strip_suffix(domain.as_str())
                .is_some_and(|head| head.ends_with('.') && head.len() > 1),
            AllowKind::Block(_) => false,
        })
    }

    /// What to do with a host name, as a URL's parser gives it (or a resolver is asked).
    /// An address written as a name (`127.0.0.1`, `[::1]`) is checked as that address.
    pub fn check_name(&self, name: &str) -> Verdict {
        if let Some(ip) = parse_ip(name) {
            return self
                .check_ip(ip)
                .err()
                .map_or(Verdict::Allowed, Verdict::Refused);
        }
        if self.allows_name(name) {
            return Verdict::Allowed;
        }
        let normal = normal_name(name);
        if normal == "localhost" || normal.ends_with(".localhost") {
            return Verdict::Refused(Refusal {
                destination: name.to_owned(),
                reason: Reason::LocalName,
                embedded: None,
            });
        }
        Verdict::Resolve
    }

    /// What to do with a URL's host. A URL without one has nowhere to go: it is allowed here and
    /// left to fail.
    pub fn check_url(&self, url: &Url) -> Verdict {
        match url.host() {
            Some(url::Host::Ipv4(ip)) => self.check_ip(ip.into()),
            Some(url::Host::Ipv6(ip)) => self.check_ip(ip.into()),
            Some(url::Host::Domain(name)) => return self.check_name(name),
            None => return Verdict::Allowed,
        }
        .err()
        .map_or(Verdict::Allowed, Verdict::Refused)
    }
}

/// An absolute `http://` or `https://` URL with a host, or why `text` is not one: what an HTTP
/// step may call.
pub fn http_url(text: &str) -> Result<Url, String> {
    match Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => Ok(url),
        Ok(_) => Err(format!(
            "'{text}' is not an http:// or https:// URL with a host"
        )),
        Err(error) => Err(format!("'{text}' is not a valid URL ({error})")),
    }
}

/// A URL as shown to someone who may not see where it points in full: the scheme, host and port
/// only, since the user information, path and query often carry secrets
/// (`https://hooks.example.com/…`). Text that is no URL is hidden entirely.
pub fn redact_url(text: &str) -> String {
    match Url::parse(text) {
        Ok(url) => match url.host_str() {
            Some(host) => match url.port() {
                Some(port) => format!("{}://{host}:{port}/…", url.scheme()),
                None => format!("{}://{host}/…", url.scheme()),
            },
            None => format!("{}:…", url.scheme()),
        },
        Err(_) => "…".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn reason(policy: &DestinationPolicy, text: &str) -> Option<Reason> {
        policy
            .check_ip(ip(text))
            .err()
            .map(|refusal| refusal.reason)
    }

    fn url_verdict(policy: &DestinationPolicy, text: &str) -> Verdict {
        policy.check_url(&Url::parse(text).unwrap())
    }

    #[test]
    fn every_local_ipv4_range_is_refused_by_default() {
        let policy = DestinationPolicy::default();
        for (address, expected) in [
            ("0.0.0.0", Reason::Unspecified),
            ("0.255.255.255", Reason::Unspecified),
            ("127.0.0.1", Reason::Loopback),
            ("127.255.255.254", Reason::Loopback),
            ("10.0.0.1", Reason::Private),
            ("10.255.255.255", Reason::Private),
            ("172.16.0.1", Reason::Private),
            ("172.31.255.255", Reason::Private),
            ("192.168.1.1", Reason::Private),
            ("100.64.0.1", Reason::Shared),
            ("100.127.255.255", Reason::Shared),
            ("169.254.169.254", Reason::Metadata),
            ("169.254.1.1", Reason::LinkLocal),
            ("100.100.100.200", Reason::Metadata),
            ("224.0.0.1", Reason::Multicast),
            ("239.255.255.255", Reason::Multicast),
            ("255.255.255.255", Reason::Broadcast),
            ("240.0.0.1", Reason::Reserved),
        ] {
            assert_eq!(reason(&policy, address), Some(expected), "{address}");
        }
    }

    #[test]
    fn public_addresses_next_to_the_refused_ranges_are_allowed() {
        let policy = DestinationPolicy::default();
        for address in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2003::1",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "::ffff:8.8.8.8",
            "fbff:ffff::1",
            "fe00::1",
        ] {
            assert_eq!(policy.check_ip(ip(address)), Ok(()), "{address}");
        }
    }

    #[test]
    fn every_local_ipv6_range_is_refused_by_default() {
        let policy = DestinationPolicy::default();
        for (address, expected) in [
            ("::", Reason::Unspecified),
            ("::1", Reason::Loopback),
            ("fe80::1", Reason::LinkLocal),
            ("febf:ffff::1", Reason::LinkLocal),
            ("fec0::1", Reason::SiteLocal),
            ("fc00::1", Reason::UniqueLocal),
            ("fd12:3456:789a::1", Reason::UniqueLocal),
            ("ff02::1", Reason::Multicast),
            ("ff0e::1", Reason::Multicast),
            ("64:ff9b:1::a00:1", Reason::LocalNat64),
            ("64:ff9b:1:ffff::808:808", Reason::LocalNat64),
        ] {
            let refusal = policy.check_ip(ip(address)).unwrap_err();
            assert_eq!(refusal.reason, expected, "{address}");
            assert_eq!(refusal.embedded, None, "{address}");
        }
    }

    #[test]
    fn ipv4_addresses_inside_ipv6_ones_are_refused_in_every_form() {
        let policy = DestinationPolicy::default();
        for (address, form, v4, expected) in [
            (
                "::ffff:127.0.0.1",
                Embedding::Mapped,
                "127.0.0.1",
                Reason::Loopback,
            ),
            (
                "::ffff:7f00:1",
                Embedding::Mapped,
                "127.0.0.1",
                Reason::Loopback,
            ),
            (
                "::ffff:169.254.169.254",
                Embedding::Mapped,
                "169.254.169.254",
                Reason::Metadata,
            ),
            (
                "::ffff:0.0.0.0",
                Embedding::Mapped,
                "0.0.0.0",
                Reason::Unspecified,
            ),
            (
                "::ffff:0:10.0.0.1",
                Embedding::Translated,
                "10.0.0.1",
                Reason::Private,
            ),
            (
                "::127.0.0.1",
                Embedding::Compatible,
                "127.0.0.1",
                Reason::Loopback,
            ),
            (
                "::192.168.0.1",
                Embedding::Compatible,
                "192.168.0.1",
                Reason::Private,
            ),
            (
                "::0.0.0.2",
                Embedding::Compatible,
                "0.0.0.2",
                Reason::Unspecified,
            ),
            (
                "2002:7f00:1::",
                Embedding::SixToFour,
                "127.0.0.1",
                Reason::Loopback,
            ),
            (
                "2002:a9fe:a9fe:1::1",
                Embedding::SixToFour,
                "169.254.169.254",
                Reason::Metadata,
            ),
            (
                "2002:c0a8:101::",
                Embedding::SixToFour,
                "192.168.1.1",
                Reason::Private,
            ),
            (
                "64:ff9b::127.0.0.1",
                Embedding::Nat64,
                "127.0.0.1",
                Reason::Loopback,
            ),
            (
                "64:ff9b::a9fe:a9fe",
                Embedding::Nat64,
                "169.254.169.254",
                Reason::Metadata,
            ),
            (
                "64:ff9b::6440:1",
                Embedding::Nat64,
                "100.64.0.1",
                Reason::Shared,
            ),
            (
                "::ffff:224.0.0.1",
                Embedding::Mapped,
                "224.0.0.1",
                Reason::Multicast,
            ),
            (
                "::ffff:255.255.255.255",
                Embedding::Mapped,
                "255.255.255.255",
                Reason::Broadcast,
            ),
        ] {
            let refusal = policy.check_ip(ip(address)).unwrap_err();
            assert_eq!(refusal.reason, expected, "{address}");
            assert_eq!(
                refusal.embedded,
                Some((form, v4.parse().unwrap())),
                "{address}"
            );
        }
    }

    #[test]
    fn the_private_network_policy_permits_internal_ranges_but_not_this_host_or_metadata() {
        let policy = DestinationPolicy::default().private_network();
        for permitted in [
            "10.1.2.3",
            "172.20.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "fd12::1",
            "::ffff:10.0.0.1",
        ] {
            assert_eq!(reason(&policy, permitted), None, "{permitted}");
        }
        for (address, expected) in [
            ("127.0.0.1", Reason::Loopback),
            ("0.0.0.0", Reason::Unspecified),
            ("169.254.169.254", Reason::Metadata),
            ("169.254.10.1", Reason::LinkLocal),
            ("100.100.100.200", Reason::Metadata),
            ("fd00:ec2::254", Reason::Metadata),
            ("::1", Reason::Loopback),
            ("::ffff:127.0.0.1", Reason::Loopback),
            ("fe80::1", Reason::LinkLocal),
            ("224.0.0.1", Reason::Multicast),
        ] {
            assert_eq!(reason(&policy, address), Some(expected), "{address}");
        }
        assert!(matches!(
            policy.check_name("localhost"),
            Verdict::Refused(_)
        ));
        let opened = DestinationPolicy::allowing(["127.0.0.1"])
            .unwrap()
            .private_network();
        assert_eq!(reason(&opened, "127.0.0.1"), None);
    }

    #[test]
    fn a_refusal_says_what_the_address_is_and_what_it_carries() {
        let policy = DestinationPolicy::default();
        assert_eq!(
            policy.check_ip(ip("127.0.0.1")).unwrap_err().to_string(),
            "127.0.0.1 is a loopback address"
        );
        assert_eq!(
            policy
                .check_ip(ip("::ffff:7f00:1"))
                .unwrap_err()
                .to_string(),
            "::ffff:127.0.0.1 is the IPv4-mapped form of 127.0.0.1, a loopback address"
        );
    }

    #[test]
    fn numeric_spellings_in_urls_are_the_ipv4_address_they_denote() {
        let policy = DestinationPolicy::default();
        for url in [
            "http://2130706433/",
            "http://0x7f.1/",
            "http://0x7f000001/",
            "http://017700000001/",
            "http://127.1/",
            "http://127.0.0.1./",
            "http://0/",
            "http://0x0/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::1]:7433/api/v1/jobs",
            "http://user:pass@127.0.0.1:7433/",
            "http://169.254.169.254/latest/meta-data/",
            "http://%31%32%37.0.0.1/",
            "HTTP://0177.0.0.1/",
        ] {
            assert!(
                matches!(url_verdict(&policy, url), Verdict::Refused(_)),
                "{url}"
            );
        }
        let Verdict::Refused(refusal) = url_verdict(&policy, "http://2130706433/") else {
            unreachable!()
        };
        assert_eq!(refusal.destination, "127.0.0.1");
    }

    #[test]
    fn localhost_names_are_refused_without_dns_and_other_names_are_resolved() {
        let policy = DestinationPolicy::default();
        for url in [
            "http://localhost/",
            "http://LOCALHOST:8080/",
            "http://localhost./",
            "http://api.localhost/",
            "http://a.b.localhost./x",
        ] {
            let Verdict::Refused(refusal) = url_verdict(&policy, url) else {
                panic!("{url} is not refused");
            };
            assert_eq!(refusal.reason, Reason::LocalName, "{url}");
        }
        for url in [
            "https://hooks.example.com/x",
            "http://localhost.example.com/",
            "http://notlocalhost/",
        ] {
            assert_eq!(url_verdict(&policy, url), Verdict::Resolve, "{url}");
        }
        assert_eq!(
            url_verdict(&policy, "https://1.1.1.1/hook"),
            Verdict::Allowed
        );
    }

    #[test]
    fn allowed_blocks_and_addresses_open_exactly_what_they_hold() {
        let policy =
            DestinationPolicy::allowing(["127.0.0.1", "10.1.0.0/16", "[::1]", "fd00::/8"]).unwrap();
        for open in [
            "127.0.0.1",
            "::ffff:127.0.0.1",
            "10.1.2.3",
            "10.1.255.255",
            "::1",
            "fd00::5",
            "64:ff9b::a01:203",
        ] {
            assert_eq!(policy.check_ip(ip(open)), Ok(()), "{open}");
        }
        for closed in [
            "127.0.0.2",
            "10.2.0.1",
            "10.0.255.255",
            "fe80::1",
            "fc00::1",
        ] {
            assert!(policy.check_ip(ip(closed)).is_err(), "{closed}");
        }
        assert_eq!(
            url_verdict(&policy, "http://2130706433:8080/hook"),
            Verdict::Allowed
        );
        assert!(matches!(
            url_verdict(&policy, "http://localhost:8080/hook"),
            Verdict::Refused(_)
        ));
        let everything = DestinationPolicy::allowing(["0.0.0.0/0", "::/0"]).unwrap();
        for address in ["127.0.0.1", "::1", "169.254.169.254", "fe80::1"] {
            assert_eq!(everything.check_ip(ip(address)), Ok(()), "{address}");
        }
    }

    #[test]
    fn allowed_host_names_open_the_name_whatever_it_resolves_to() {
        let policy =
            DestinationPolicy::allowing(["localhost", "Hooks.Internal.", "*.svc.cluster.local"])
                .unwrap();
        for url in [
            "http://localhost:9000/x",
            "http://hooks.internal/x",
            "http://HOOKS.internal./x",
            "http://a.svc.cluster.local/",
            "http://b.a.svc.cluster.local/",
        ] {
            assert_eq!(url_verdict(&policy, url), Verdict::Allowed, "{url}");
        }
        for url in [
            "http://svc.cluster.local/",
            "http://xsvc.cluster.local/",
            "http://other.internal/",
        ] {
            assert_eq!(url_verdict(&policy, url), Verdict::Resolve, "{url}");
        }
        assert!(matches!(
            url_verdict(&policy, "http://api.localhost/"),
            Verdict::Refused(_)
        ));
        assert!(
            policy.check_ip(ip("127.0.0.1")).is_err(),
            "a name opens the name, not its addresses"
        );
    }

    #[test]
    fn allow_entries_are_read_as_blocks_addresses_or_names() {
        let read = |text: &str| text.parse::<Allow>().map(|allow| allow.to_string());
        assert_eq!(read(" 10.0.0.0/8 ").unwrap(), "10.0.0.0/8");
        assert_eq!(read("127.0.0.1").unwrap(), "127.0.0.1/32");
        assert_eq!(read("::1").unwrap(), "::1/128");
        assert_eq!(read("[::1]").unwrap(), "::1/128");
        assert_eq!(read("[fd00::]/8").unwrap(), "fd00::/8");
        assert_eq!(read("2130706433").unwrap(), "127.0.0.1/32");
        assert_eq!(read("0x7f.1").unwrap(), "127.0.0.1/32");
        assert_eq!(read("Hooks.Example.").unwrap(), "hooks.example");
        assert_eq!(read("*.svc.cluster.local").unwrap(), "*.svc.cluster.local");
        for (bad, says) in [
            ("", "is empty"),
            ("10.0.0.1/8", "did you mean 10.0.0.0/8?"),
            ("10.0.0.0/33", "0 to 32"),
            ("fd00::/129", "0 to 128"),
            ("host/8", "no address"),
            ("http://hooks.example", "is a URL"),
            ("hooks example", "not a host name"),
            ("*.127.0.0.1", "'*.' goes before a domain name"),
            ("a..b", "not a host name"),
        ] {
            let error = read(bad).unwrap_err();
            assert!(error.to_string().contains(says), "{bad}: {error}");
        }
        assert!(DestinationPolicy::allowing(["127.0.0.1", "nope/1"]).is_err());
    }

    #[test]
    fn a_redacted_url_keeps_scheme_host_and_port_only() {
        for (url, shown) in [
            (
                "https://user:secret@hooks.example.com/t/abc123?key=s#f",
                "https://hooks.example.com/…",
            ),
            (
                "http://hooks.example.com:8080/x",
                "http://hooks.example.com:8080/…",
            ),
            (
                "https://hooks.example.com:443/x",
                "https://hooks.example.com/…",
            ),
            ("http://[::1]:9/secret", "http://[::1]:9/…"),
            ("not a url", "…"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
