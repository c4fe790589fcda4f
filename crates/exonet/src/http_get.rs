//! `exonet http-get`: fetches one `http://` URL over the protocol library's
//! TCP (HTTP/1.1, `Connection: close`) and writes the body to a file or
//! stdout; the status, size, time and throughput go to stderr. The response
//! is parsed strictly and read with bounded memory: its body by
//! `Content-Length`, chunked transfer coding, or to the end of the
//! connection (RFC 9112 §6.3).

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use exonet_stack::TcpStream;

use crate::tool::{self, HeadError, Headers, Patient};

/// The largest response head.
const HEAD_MAX: usize = 64 * 1024;
/// The most header fields in a response.
const FIELDS_MAX: usize = 200;
/// The longest chunk-size or trailer line.
const CHUNK_LINE_MAX: usize = 4096;
/// Interim (1xx) responses skipped before the final one.
const INTERIM_MAX: usize = 10;

#[derive(Debug, Args)]
pub struct HttpGetArgs {
    /// `http://HOST[:PORT][/PATH]`; HOST an IPv4 address or a name that
    /// resolves to one.
    #[arg(value_name = "URL", value_parser = parse_url)]
    url: Url,
    /// Write the body to this file instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The daemon's control socket (default as for `exonet daemon`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Seconds to wait for the connection and between bytes.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
}

/// An `http://` URL, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    /// `HOST[:PORT]` as written: the `Host` field.
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`.
    pub path: String,
}

/// Clap parser for `http://HOST[:PORT][/PATH]` (RFC 9110 §4.2.1), strictly:
/// no user info, no IPv6, no bytes a URL may not hold.
pub fn parse_url(s: &str) -> Result<Url, String> {
    let scheme_end = s
        .find("://")
        .ok_or_else(|| format!("`{s}`: expected a URL such as http://10.77.1.1:8080/file"))?;
    let scheme = &s[..scheme_end];
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(format!(
            "`{s}`: only http:// URLs are supported, not {scheme}://"
        ));
    }
    let rest = &s[scheme_end + 3..];
    if let Some(c) = rest.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "`{s}`: {c:?} may not appear in a URL (percent-encode it)"
        ));
    }
    // The fragment is the client's own business (RFC 9110 §4.2.5).
    let rest = rest.split('#').next().unwrap_or("");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.contains('@') {
        return Err(format!("`{s}`: user information in URLs is not supported"));
    }
    if authority.starts_with('[') {
        return Err(format!("`{s}`: IPv6 hosts are not supported"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => {
            let port = p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| format!("`{s}`: bad port {p:?}"))?;
            (h, port)
        }
        None => (authority, 80),
    };
    if host.is_empty() {
        return Err(format!("`{s}`: no host"));
    }
    let path = match path {
        "" => "/".to_string(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_string(),
    };
    Ok(Url {
        authority: authority.to_string(),
        host: host.to_string(),
        port,
        path,
    })
}

/// A parsed response head.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub reason: String,
    pub headers: Headers,
}

/// Parses a response head as [`tool::read_head`] returned it.
pub fn parse_response(head: &[u8]) -> Result<Response, String> {
    let mut lines = tool::head_lines(head);
    let line = lines.next().ok_or("empty response")?;
    let text = String::from_utf8_lossy(line);
    let bad = || format!("bad status line {text:?}");
    let rest = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))
        .ok_or_else(bad)?;
    let (code, reason) = rest.split_once(' ').unwrap_or((rest, ""));
    if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) || code.starts_with('0') {
        return Err(bad());
    }
    if reason.chars().any(|c| c.is_control() && c != '\t') {
        return Err(bad());
    }
    Ok(Response {
        status: code.parse().map_err(|_| bad())?,
        reason: reason.to_string(),
        headers: Headers::parse(lines, FIELDS_MAX)?,
    })
}

/// How the body is delimited (RFC 9112 §6.3).
#[derive(Debug, PartialEq, Eq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
    ToEof,
}

pub fn framing(r: &Response) -> Result<Framing, String> {
    if r.status == 204 || r.status == 304 || r.status < 200 {
        return Ok(Framing::None);
    }
    let codings: Vec<&str> = r.headers.all("transfer-encoding").collect();
    if !codings.is_empty() {
        let last = codings
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .rfind(|c| !c.is_empty())
            .unwrap_or("");
        return Ok(if last.eq_ignore_ascii_case("chunked") {
            Framing::Chunked
        } else {
            Framing::ToEof
        });
    }
    Ok(match r.headers.content_length()? {
        Some(n) => Framing::Length(n),
        None => Framing::ToEof,
    })
}

fn invalid(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

/// One line of at most `max` bytes, without its CRLF or LF.
fn read_line<R: BufRead>(r: &mut R, max: usize) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    r.take(max as u64 + 1).read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Err(if line.len() > max {
            invalid(format!("a line longer than {max} bytes in a chunked body"))
        } else {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection closed inside a chunked body",
            )
        });
    }
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(line)
}

/// Copies exactly `n` bytes.
fn copy_exact<R: Read, W: Write>(r: &mut R, w: &mut W, n: u64) -> io::Result<u64> {
    let got = io::copy(&mut r.take(n), w)?;
    if got < n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the connection closed after {got} of {n} body bytes"),
        ));
    }
    Ok(got)
}

/// Decodes a chunked body (RFC 9112 §7.1) into `w`; returns its length.
pub fn copy_chunked<R: BufRead, W: Write>(r: &mut R, w: &mut W) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        let line = read_line(r, CHUNK_LINE_MAX)?;
        let size = line.split(|&b| b == b';').next().unwrap_or_default();
        let size = std::str::from_utf8(size.trim_ascii_end())
            .ok()
            .filter(|s| !s.is_empty() && s.len() <= 15 && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|s| u64::from_str_radix(s, 16).ok())
            .ok_or_else(|| {
                invalid(format!(
                    "bad chunk size line {:?}",
                    String::from_utf8_lossy(&line)
                ))
            })?;
        if size == 0 {
            break;
        }
        total += copy_exact(r, w, size)?;
        if !read_line(r, 2)?.is_empty() {
            return Err(invalid("a chunk longer than its size"));
        }
    }
    // Trailer fields, ignored, up to the empty line.
    for _ in 0..FIELDS_MAX {
        if read_line(r, CHUNK_LINE_MAX)?.is_empty() {
            return Ok(total);
        }
    }
    Err(invalid(format!("more than {FIELDS_MAX} trailer fields")))
}

pub fn run(args: &HttpGetArgs) -> ExitCode {
    match get(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("exonet http-get: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Fetches the URL; whether the status was 2xx.
fn get(args: &HttpGetArgs) -> io::Result<bool> {
    let url = &args.url;
    let ip = tool::host(&url.host).map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))?;
    let target = SocketAddrV4::new(ip, url.port);
    let stack = tool::open_stack(args.socket.as_ref(), &tool::busy_poll(0))?;
    let timeout = Duration::from_secs(args.timeout);
    let started = Instant::now();
    let s = TcpStream::connect_timeout(&stack, target, timeout)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot connect to {target}: {e}")))?;
    s.set_write_timeout(Some(timeout))?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: exonet/{}\r\nAccept: */*\r\n\
         Connection: close\r\n\r\n",
        url.path,
        url.authority,
        env!("CARGO_PKG_VERSION")
    );
    (&mut &s).write_all(request.as_bytes())?;
    let mut r = BufReader::with_capacity(64 * 1024, Patient::new(&s, Some(timeout))?);
    let mut interim = 0;
    let response = loop {
        let head = match tool::read_head(&mut r, HEAD_MAX, HEAD_MAX) {
            Ok(Some(h)) => h,
            Ok(None) => return Err(invalid(format!("{target} closed without answering"))),
            Err(HeadError::Io(e)) => return Err(e),
            Err(HeadError::Truncated) => {
                return Err(invalid(format!("{target} closed inside the response head")))
            }
            Err(HeadError::LineTooLong | HeadError::TooLarge) => {
                return Err(invalid(format!("response head over {HEAD_MAX} bytes")))
            }
        };
        let response = parse_response(&head).map_err(invalid)?;
        // Interim responses (100 Continue, 103 Early Hints) precede the
        // final one; 101 would switch protocols, which was not asked for.
        if response.status >= 200 || response.status == 101 {
            break response;
        }
        interim += 1;
        if interim > INTERIM_MAX {
            return Err(invalid("too many interim responses"));
        }
    };
    if response.status == 101 {
        return Err(invalid("the server switched protocols unasked"));
    }
    let framing = framing(&response).map_err(invalid)?;
    let mut out: BufWriter<Box<dyn Write>> = BufWriter::with_capacity(
        64 * 1024,
        match &args.output {
            Some(path) => Box::new(File::create(path).map_err(|e| {
                io::Error::new(e.kind(), format!("cannot write {}: {e}", path.display()))
            })?),
            None => Box::new(io::stdout().lock()),
        },
    );
    let body = match framing {
        Framing::None => 0,
        Framing::Length(n) => copy_exact(&mut r, &mut out, n)?,
        Framing::Chunked => copy_chunked(&mut r, &mut out)?,
        Framing::ToEof => io::copy(&mut r, &mut out)?,
    };
    out.flush()?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "exonet http-get: {} {}, {body} bytes in {secs:.3} s ({:.1} Mbit/s)",
        response.status,
        response.reason,
        tool::gbps(body, secs) * 1e3
    );
    let ok = (200..300).contains(&response.status);
    if !ok {
        let location = response
            .headers
            .get("location")
            .map(|l| format!(" (Location: {l}; not followed)"))
            .unwrap_or_default();
        eprintln!(
            "exonet http-get: http://{}{} answered {} {}{location}",
            url.authority, url.path, response.status, response.reason
        );
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_strictly() {
        let u = parse_url("http://10.77.1.1:8080/a/b?c=d#frag").unwrap();
        assert_eq!(
            u,
            Url {
                authority: "10.77.1.1:8080".into(),
                host: "10.77.1.1".into(),
                port: 8080,
                path: "/a/b?c=d".into(),
            }
        );
        let u = parse_url("HTTP://localhost").unwrap();
        assert_eq!((u.port, u.path.as_str()), (80, "/"));
        assert_eq!(parse_url("http://h?x").unwrap().path, "/?x");
        for (bad, says) in [
            ("10.77.1.1/x", "expected a URL"),
            ("https://h/", "only http://"),
            ("http://u:p@h/", "user information"),
            ("http://[::1]/", "IPv6"),
            ("http://h:0/", "bad port"),
            ("http://h:99999/", "bad port"),
            ("http://h:x/", "bad port"),
            ("http:///x", "no host"),
            ("http://h/a b", "percent-encode"),
        ] {
            let e = parse_url(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn responses_parse_strictly() {
        let r =
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n")
                .unwrap();
        assert_eq!((r.status, r.reason.as_str()), (200, "OK"));
        assert_eq!(framing(&r), Ok(Framing::Length(5)));
        let r = parse_response(b"HTTP/1.0 404\n\n").unwrap();
        assert_eq!((r.status, r.reason.as_str()), (404, ""));
        assert_eq!(framing(&r), Ok(Framing::ToEof));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 9\r\n\r\n",
        )
        .unwrap();
        assert_eq!(framing(&r), Ok(Framing::Chunked));
        let r = parse_response(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n").unwrap();
        assert_eq!(framing(&r), Ok(Framing::None));
        for bad in [
            &b""[..],
            b"HTTP/2 200 OK\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"ICY 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\x01\r\n\r\n",
        ] {
            assert!(
                parse_response(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for bad_length in ["5, 6", "-1", "x", "", "99999999999999999999999"] {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {bad_length}\r\n\r\n");
            let r = parse_response(head.as_bytes()).unwrap();
            assert!(framing(&r).is_err(), "{bad_length:?}");
        }
    }

    fn chunked(input: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        copy_chunked(&mut io::BufReader::with_capacity(3, input), &mut out)?;
        Ok(out)
    }

    #[test]
    fn chunked_bodies_decode_within_bounds() {
        let body = chunked(b"5\r\nhello\r\n1;ext=1\r\n \r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n");
        assert_eq!(body.unwrap(), b"hello 0123456789");
        assert_eq!(chunked(b"0\n\n").unwrap(), b"");
        for bad in [
            &b"5\r\nhel"[..],
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"g\r\n",
            b"\r\n",
            b"-1\r\n",
            b"ffffffffffffffff\r\nx",
            b"0\r\n",
            b"5\r\nhello\r\n",
        ] {
            assert!(chunked(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let endless = vec![b'1'; 1 << 20];
        let e = chunked(&endless).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
    }
}
