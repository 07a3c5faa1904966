//! The SSRF guard of the open-page tool (security-critical): which URLs and addresses a fetch
//! may reach. [`check_url`] judges a URL before anything goes to the network (http/https only, a
//! host, no credentials, an IP-literal host must be public); [`GuardedResolver`] resolves host
//! names and keeps only public addresses, so the connection goes only to an address that was
//! checked (no DNS-rebinding gap); [`redirect_verdict`] applies the same rules, and the redirect
//! cap, to every redirect target. [`is_public_ip`] is the address table all three use. A
//! refusal travels through reqwest's error chain as a [`Refusal`] and surfaces as
//! `SearchError::UrlRejected`.

use std::error::Error as StdError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use url::{Host, Url};

use super::PageConfig;
use crate::search::SearchError;

/// Our refusal of an address or a redirect, carried through reqwest's error chain.
#[derive(Debug)]
pub(super) struct Refusal(pub(super) String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Refusal {}

/// Resolves host names with the system resolver and keeps only public addresses (unless
/// private ones are allowed), failing when none is left.
#[derive(Debug)]
pub(super) struct GuardedResolver {
    pub(super) allow_private: bool,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow_private = self.allow_private;
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept: Vec<SocketAddr> =
                found.iter().copied().filter(|a| allow_private || is_public_ip(a.ip())).collect();
            if kept.is_empty() {
                let why = if found.is_empty() {
                    format!("{host} has no address")
                } else {
                    format!("{host} resolves to a non-public address")
                };
                return Err(Box::new(Refusal(why)) as Box<dyn StdError + Send + Sync>);
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The redirect policy of a page client: follow a redirect only when [`redirect_verdict`] allows
/// it, else fail the fetch with the [`Refusal`].
pub(super) fn redirect_policy(cfg: PageConfig) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        match redirect_verdict(attempt.url(), attempt.previous().len(), &cfg) {
            Ok(()) => attempt.follow(),
            Err(why) => attempt.error(Refusal(why)),
        }
    })
}

/// Whether to follow a redirect to `next`, the `hops`-th of this fetch (1 for the first).
pub(super) fn redirect_verdict(next: &Url, hops: usize, cfg: &PageConfig) -> Result<(), String> {
    if hops > cfg.max_redirects {
        return Err(format!("more than {} redirects", cfg.max_redirects));
    }
    match check_url(next.as_str(), cfg.allow_private) {
        Ok(_) => Ok(()),
        Err(SearchError::UrlRejected(why)) => Err(format!("redirect to {next}: {why}")),
        Err(e) => Err(format!("redirect to {next}: {e}")),
    }
}

/// Scheme http/https only, a host, no credentials in the URL; an IP-literal host must be public
/// unless `allow_private`. Host names are judged when they are resolved.
pub fn check_url(url: &str, allow_private: bool) -> Result<Url, SearchError> {
    let reject = |why: String| SearchError::UrlRejected(why);
    let parsed = Url::parse(url.trim()).map_err(|e| reject(format!("not a valid URL ({e})")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(reject(format!("scheme `{}` not allowed", parsed.scheme())));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(reject("credentials in the URL".into()));
    }
    let ip = match parsed.host() {
        None => return Err(reject("no host".into())),
        Some(Host::Domain("")) => return Err(reject("no host".into())),
        Some(Host::Domain(_)) => None,
        Some(Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Some(Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
    };
    if let Some(ip) = ip
        && !allow_private
        && !is_public_ip(ip)
    {
        return Err(reject(format!("{ip} is not a public address")));
    }
    Ok(parsed)
}

/// False for loopback, unspecified, private, shared (CGNAT), link-local, `0/8`, broadcast,
/// multicast, documentation, benchmarking and reserved IPv4 ranges, and for IPv6 `::1`, `::`,
/// unique-local, link-local, site-local, multicast and documentation ranges. IPv6 forms that
/// embed an IPv4 address (mapped, SIIT-translated, NAT64, 6to4) are judged as that IPv4 address;
/// local-use NAT64 (64:ff9b:1::/48) is refused.
pub fn is_public_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let refused = a == 0 // "this network", includes the unspecified address
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 169 && b == 254)
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 168)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 224; // multicast, reserved, broadcast
    !refused
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    let seg = ip.segments();
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its low 32 bits.
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(Ipv4Addr::new((seg[6] >> 8) as u8, seg[6] as u8, (seg[7] >> 8) as u8, seg[7] as u8));
    }
    // SIIT's IPv4-translated form (::ffff:0:0/96) carries one in its low 32 bits too.
    if seg[..6] == [0, 0, 0, 0, 0xffff, 0] {
        return is_public_v4(Ipv4Addr::new((seg[6] >> 8) as u8, seg[6] as u8, (seg[7] >> 8) as u8, seg[7] as u8));
    }
    // 6to4 (2002::/16) carries one in bits 16..48.
    if seg[0] == 0x2002 {
        return is_public_v4(Ipv4Addr::new((seg[1] >> 8) as u8, seg[1] as u8, (seg[2] >> 8) as u8, seg[2] as u8));
    }
    let refused = seg[..6] == [0; 6] // ::, ::1 and the deprecated IPv4-compatible ::/96
        || (seg[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (seg[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
        || (seg[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
        || (seg[0] & 0xff00) == 0xff00 // multicast
        || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        || (seg[0] == 0x2001 && seg[1] == 0) // Teredo
        || seg[..4] == [0x100, 0, 0, 0] // discard-only 100::/64
        || seg[..3] == [0x64, 0xff9b, 1]; // local-use NAT64 64:ff9b:1::/48 (RFC 8215): a local translator
    !refused
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::testkit::{Canned, ScriptedServer};

    #[tokio::test]
    async fn private_and_malformed_urls_are_refused_before_any_request() {
        let server = ScriptedServer::start(|_| Canned::html("<p>secret</p>")).await.unwrap();
        let port = server.addr().port();
        let f = fetcher(cfg(false));
        let urls = [
            format!("http://127.0.0.1:{port}/"),
            "http://10.0.0.1/".to_string(),
            format!("http://[::1]:{port}/"),
            "http://169.254.169.254/latest".to_string(),
            format!("http://localhost:{port}/"),
            "file:///etc/passwd".to_string(),
            "ftp://x".to_string(),
            "http://user:pw@example.com/".to_string(),
            format!("http://[::ffff:127.0.0.1]:{port}/"),
            format!("http://0x7f.1:{port}/"),
            "not a url".to_string(),
        ];
        for url in &urls {
            let err = f.fetch(url).await.unwrap_err();
            assert!(matches!(err, SearchError::UrlRejected(_)), "{url}: {err:?}");
        }
        let err = f.fetch(&format!("http://localhost:{port}/")).await.unwrap_err();
        assert!(matches!(&err, SearchError::UrlRejected(why) if why.contains("non-public")), "{err:?}");
        assert_eq!(server.count(), 0);
        let usage = f.usage();
        assert_eq!(usage.errors, urls.len() as u64 + 1);
        assert_eq!(usage.calls, 2, "only `localhost` got as far as resolution");
    }

    #[tokio::test]
    async fn redirect_to_a_refused_scheme_is_rejected() {
        let server = ScriptedServer::start(|r| match r.target.as_str() {
            "/ftp" => Canned::status(301, "").header("location", "ftp://example.com/file"),
            _ => Canned::status(302, "").header("location", "file:///etc/passwd"),
        })
        .await
        .unwrap();
        let f = fetcher(cfg(true));
        for path in ["/ftp", "/file"] {
            let err = f.fetch(&format!("{}{path}", server.url())).await.unwrap_err();
            assert!(matches!(&err, SearchError::UrlRejected(why) if why.contains("scheme")), "{path}: {err:?}");
        }
    }

    #[test]
    fn check_url_accepts_public_urls() {
        for url in
            ["http://example.com/", "https://93.184.216.34/x?y=1", "https://[2606:4700::1111]/", "http://localhost/"]
        {
            assert!(check_url(url, false).is_ok(), "{url}");
        }
        assert!(check_url("http://127.0.0.1:8080/", true).is_ok());
        assert!(check_url("ftp://127.0.0.1/", true).is_err());
        assert!(check_url("http://u@127.0.0.1/", true).is_err());
    }

    #[test]
    fn public_ip_table() {
        let table: &[(&str, bool)] = &[
            ("8.8.8.8", true),
            ("93.184.216.34", true),
            ("1.1.1.1", true),
            ("127.0.0.1", false),
            ("127.255.0.3", false),
            ("0.0.0.0", false),
            ("0.1.2.3", false),
            ("10.1.2.3", false),
            ("172.16.0.1", false),
            ("172.31.255.255", false),
            ("172.32.0.1", true),
            ("192.168.1.1", false),
            ("100.64.0.1", false),
            ("100.127.255.255", false),
            ("100.128.0.1", true),
            ("169.254.169.254", false),
            ("255.255.255.255", false),
            ("224.0.0.1", false),
            ("192.0.2.1", false),
            ("198.51.100.7", false),
            ("203.0.113.9", false),
            ("2606:4700:4700::1111", true),
            ("2001:4860:4860::8888", true),
            ("::1", false),
            ("::", false),
            ("fc00::1", false),
            ("fd12:3456::1", false),
            ("fe80::1", false),
            ("ff02::1", false),
            ("2001:db8::1", false),
            ("::ffff:127.0.0.1", false),
            ("::ffff:10.0.0.1", false),
            ("::ffff:8.8.8.8", true),
            ("64:ff9b::a00:1", false),
            ("64:ff9b::808:808", true),
            ("64:ff9b:1::808:808", false),
            ("::ffff:0:a00:1", false),
            ("::ffff:0:808:808", true),
            ("2002:7f00:1::", false),
        ];
        for &(ip, public) in table {
            let parsed: IpAddr = ip.parse().unwrap();
            assert_eq!(is_public_ip(parsed), public, "{ip}");
        }
    }

    #[test]
    fn redirect_verdicts() {
        let c = PageConfig { max_redirects: 2, ..PageConfig::default() };
        let url = |s: &str| Url::parse(s).unwrap();
        assert_eq!(redirect_verdict(&url("https://example.com/next"), 1, &c), Ok(()));
        assert_eq!(redirect_verdict(&url("https://example.com/next"), 2, &c), Ok(()));
        assert!(redirect_verdict(&url("https://example.com/next"), 3, &c).unwrap_err().contains("redirects"));
        for target in ["http://127.0.0.1/", "http://10.0.0.1/admin", "http://[::1]/", "http://169.254.169.254/latest"] {
            assert!(redirect_verdict(&url(target), 1, &c).is_err(), "{target}");
        }
        assert!(redirect_verdict(&url("file:///etc/passwd"), 1, &c).is_err());
        assert!(redirect_verdict(&url("http://u:p@example.com/"), 1, &c).is_err());
        let open = PageConfig { allow_private: true, ..c };
        assert_eq!(redirect_verdict(&url("http://127.0.0.1/"), 1, &open), Ok(()));
    }

    /// Why `check_url` refused `url`; a panic naming the URL when it was allowed.
    fn refusal(url: &str, allow_private: bool) -> String {
        match check_url(url, allow_private) {
            Err(SearchError::UrlRejected(why)) => why,
            other => panic!("{url}: expected a refusal, got {other:?}"),
        }
    }

    fn assert_not_public(urls: &[&str]) {
        for url in urls {
            let why = refusal(url, false);
            assert!(why.contains("is not a public address"), "{url}: {why}");
            assert!(check_url(url, true).is_ok(), "{url}: allowed with allow_private");
        }
    }

    #[test]
    fn check_url_refuses_loopback() {
        assert_not_public(&[
            "http://127.0.0.1/",
            "http://127.0.0.1:8080/admin",
            "http://127.1.2.3/",
            "https://[::1]/",
            "http://[::1]:9000/x",
            // Other spellings of 127.0.0.1 that URL parsers accept.
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://127.1/",
        ]);
    }

    #[test]
    fn check_url_refuses_private_and_unspecified_ranges() {
        assert_not_public(&[
            "http://10.0.0.1/",
            "http://10.255.255.255/",
            "http://172.16.0.1/",
            "http://172.31.255.254/",
            "http://192.168.0.1/",
            "https://192.168.255.255:8443/",
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://[::]/",
        ]);
    }

    #[test]
    fn check_url_refuses_link_local() {
        assert_not_public(&[
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.0.1/",
            "http://[fe80::1]/",
            "http://[fe80::abcd:1234]:8080/",
        ]);
    }

    #[test]
    fn check_url_refuses_ipv6_unique_local() {
        assert_not_public(&[
            "http://[fc00::1]/",
            "http://[fd00::1]/",
            "http://[fd12:3456:789a::1]/",
            "http://[fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]/",
        ]);
    }

    #[test]
    fn check_url_judges_embedded_ipv4_as_that_address() {
        assert_not_public(&[
            // IPv4-mapped.
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[::ffff:10.0.0.1]/",
            "http://[::ffff:192.168.1.1]/",
            "http://[::ffff:169.254.169.254]/",
            // IPv4-compatible (deprecated), NAT64 and 6to4.
            "http://[::127.0.0.1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[2002:a00:1::]/",
        ]);
        for url in ["http://[::ffff:8.8.8.8]/", "http://[64:ff9b::808:808]/", "http://[2002:808:808::]/"] {
            assert!(check_url(url, false).is_ok(), "{url}");
        }
    }

    #[test]
    fn check_url_refuses_other_schemes_even_with_allow_private() {
        for url in [
            "file:///etc/passwd",
            "ftp://example.com/file",
            "gopher://example.com/",
            "ws://example.com/",
            "wss://example.com/",
            "data:text/html,<p>hi</p>",
            "javascript:alert(1)",
            "dict://127.0.0.1:11211/",
            "ldap://example.com/",
        ] {
            for allow_private in [false, true] {
                let why = refusal(url, allow_private);
                assert!(why.contains("scheme"), "{url}: {why}");
            }
        }
    }

    #[test]
    fn check_url_refuses_credentials_and_unparsable_urls() {
        for url in ["http://user:pw@example.com/", "http://user@example.com/", "https://:pw@example.com/"] {
            for allow_private in [false, true] {
                let why = refusal(url, allow_private);
                assert!(why.contains("credentials"), "{url}: {why}");
            }
        }
        for url in ["not a url", "http://", "", "http://exa mple.com/"] {
            let why = refusal(url, false);
            assert!(why.contains("not a valid URL"), "{url:?}: {why}");
        }
    }

    #[test]
    fn check_url_allows_public_addresses_and_host_names() {
        for url in [
            "http://8.8.8.8/",
            "https://1.1.1.1/dns-query",
            "http://93.184.216.34:8080/x?y=1",
            "http://172.32.0.1/",
            "http://100.128.0.1/",
            "https://[2606:4700:4700::1111]/",
            "http://[2001:4860:4860::8888]/",
            "HTTPS://Example.COM/Path",
            // Host names are judged when they are resolved, not here.
            "http://localhost/",
        ] {
            let parsed = check_url(url, false).unwrap_or_else(|e| panic!("{url}: {e:?}"));
            assert!(matches!(parsed.scheme(), "http" | "https"), "{url}");
        }
    }

    #[tokio::test]
    async fn resolver_keeps_only_public_addresses() {
        use reqwest::dns::Resolve;
        let name = |s: &str| s.parse::<reqwest::dns::Name>().unwrap();
        let guarded = GuardedResolver { allow_private: false };
        for host in ["localhost", "127.0.0.1"] {
            let err = match guarded.resolve(name(host)).await {
                Err(e) => e,
                Ok(addrs) => panic!("{host} resolved to {:?}", addrs.collect::<Vec<_>>()),
            };
            assert!(err.to_string().contains("non-public"), "{host}: {err}");
            assert!(err.downcast_ref::<Refusal>().is_some(), "{host}: {err:?}");
        }
        // With private addresses allowed (loopback tests), the addresses come back.
        let open = GuardedResolver { allow_private: true };
        let addrs: Vec<SocketAddr> = open.resolve(name("localhost")).await.unwrap().collect();
        assert!(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
    }
}
