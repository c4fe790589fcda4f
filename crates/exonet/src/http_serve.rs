//! `exonet http-serve`: a small static HTTP/1.1 server (RFC 9110, RFC 9112)
//! on the protocol library's TCP: GET and HEAD of the files under a
//! directory, keep-alive, a thread per connection up to a bound. Requests are
//! read with bounded memory and parsed strictly; files are streamed in
//! chunks. One access-log line per request goes to stderr.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use exonet_stack::{TcpListener, TcpStream};

use crate::tool::{self, HeadError, Headers, Patient, Slots};

/// The longest request line (414 beyond).
const LINE_MAX: usize = 8 * 1024;
/// The largest request head (431 beyond).
const HEAD_MAX: usize = 16 * 1024;
/// The most header fields in a request (431 beyond).
const FIELDS_MAX: usize = 100;
/// Bytes per read of a file and write to the connection.
const CHUNK: usize = 64 * 1024;
/// Threads that only answer 503 when all connection threads are busy; past
/// them, connections are closed unanswered.
const OVERFLOW: usize = 8;
/// How long a closing connection's unread input is drained, so that our
/// close does not reset the peer before it read the response.
const LINGER: Duration = Duration::from_secs(1);

#[derive(Debug, Args)]
pub struct HttpServeArgs {
    /// The directory to serve.
    dir: PathBuf,
    /// The port to listen on.
    #[arg(long, default_value_t = 80)]
    port: u16,
    /// The address to listen on (default: all of the daemon's).
    #[arg(long)]
    ip: Option<Ipv4Addr>,
    /// The daemon's control socket (default as for `exonet daemon`).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Connections served at once; more are answered 503.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_connections: u32,
    /// Seconds a connection may stay idle (between requests or inside one).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout: u64,
    /// Have the link answer SYNs with SYN cookies, below this process, as
    /// Linux answers them in softirq (AF_XDP links; on a veth, Linux's end
    /// must poll: GRO on or an XDP program).
    #[arg(long)]
    link_syn_cookies: bool,
}

pub fn run(args: &HttpServeArgs) -> ExitCode {
    match serve(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exonet http-serve: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What every connection thread shares.
struct Site {
    /// The served directory, canonical.
    root: PathBuf,
    idle: Duration,
    requests: AtomicU64,
}

fn serve(args: &HttpServeArgs) -> io::Result<()> {
    let root = args.dir.canonicalize().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot serve {}: {e}", args.dir.display()),
        )
    })?;
    if !root.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a directory", args.dir.display()),
        ));
    }
    tool::stop_on_signals()?;
    let mut config = tool::busy_poll(0);
    config.tcp.link_syn_cookies = args.link_syn_cookies;
    let stack = tool::open_stack(args.socket.as_ref(), &config)?;
    let ip = args.ip.unwrap_or(Ipv4Addr::UNSPECIFIED);
    let listener = TcpListener::bind(&stack, (ip, args.port))?;
    eprintln!(
        "exonet http-serve: serving {} on {}",
        root.display(),
        listener.local_addr()?
    );
    let site = Arc::new(Site {
        root,
        idle: Duration::from_secs(args.idle_timeout),
        requests: AtomicU64::new(0),
    });
    let slots = Slots::new(args.max_connections as usize);
    let overflow = Slots::new(OVERFLOW);
    tool::accept_loop(&listener, |s, peer| {
        if let Some(slot) = slots.take() {
            let site = site.clone();
            std::thread::spawn(move || {
                let _slot = slot;
                connection(&s, peer, &site);
            });
        } else if let Some(slot) = overflow.take() {
            std::thread::spawn(move || {
                let _slot = slot;
                let _ = respond_error(&s, Status::UNAVAILABLE);
                log(peer, "-", Status::UNAVAILABLE.0, 0, Instant::now());
                linger_close(&s);
            });
        }
        Ok(true)
    })?;
    eprintln!(
        "exonet http-serve: stopped after {} requests",
        site.requests.load(Ordering::Relaxed)
    );
    Ok(())
}

/// A status code and its reason phrase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u16, pub &'static str);

impl Status {
    const OK: Status = Status(200, "OK");
    const MOVED: Status = Status(301, "Moved Permanently");
    const BAD_REQUEST: Status = Status(400, "Bad Request");
    const FORBIDDEN: Status = Status(403, "Forbidden");
    const NOT_FOUND: Status = Status(404, "Not Found");
    const METHOD: Status = Status(405, "Method Not Allowed");
    const URI_TOO_LONG: Status = Status(414, "URI Too Long");
    const FIELDS_TOO_LARGE: Status = Status(431, "Request Header Fields Too Large");
    const NOT_IMPLEMENTED: Status = Status(501, "Not Implemented");
    const UNAVAILABLE: Status = Status(503, "Service Unavailable");
    const VERSION: Status = Status(505, "HTTP Version Not Supported");
}

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path and query of the target.
    pub target: String,
    /// 0 or 1: HTTP/1.0 or HTTP/1.1.
    pub minor: u8,
    pub headers: Headers,
}

impl Request {
    /// Whether the connection stays open after the response (RFC 9112 §9.3).
    pub fn keep_alive(&self) -> bool {
        if self.headers.has_token("connection", "close") {
            return false;
        }
        self.minor == 1 || self.headers.has_token("connection", "keep-alive")
    }
}

/// Parses a request head as [`tool::read_head`] returned it; an error is the
/// status to answer and why.
pub fn parse_request(head: &[u8]) -> Result<Request, (Status, String)> {
    let bad = |why: String| (Status::BAD_REQUEST, why);
    let mut lines = tool::head_lines(head);
    let line = lines.next().ok_or_else(|| bad("empty request".into()))?;
    if line.contains(&b'\r') || head.contains(&0) {
        return Err(bad("stray CR or NUL in the request".into()));
    }
    let text = std::str::from_utf8(line).map_err(|_| bad("request line is not UTF-8".into()))?;
    let mut parts = text.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(format!(
            "request line is not METHOD TARGET VERSION: {text:?}"
        )));
    };
    if method.is_empty() || !method.bytes().all(tool::is_tchar) {
        return Err(bad(format!("bad method {method:?}")));
    }
    let minor = match version {
        "HTTP/1.1" => 1,
        "HTTP/1.0" => 0,
        v if v.len() == 8 && v.starts_with("HTTP/") && v.as_bytes()[6] == b'.' => {
            return Err((Status::VERSION, format!("version {v} not supported")))
        }
        v => return Err(bad(format!("bad version {v:?}"))),
    };
    // Origin form (RFC 9112 §3.2.1); the absolute form (§3.2.2) is taken as
    // its path.
    let target = match target.strip_prefix("http://") {
        Some(rest) => format!("/{}", rest.split_once('/').map_or("", |(_, p)| p)),
        None => target.to_string(),
    };
    if !target.starts_with('/') || target.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(bad(format!("bad target {target:?}")));
    }
    let headers = Headers::parse(lines, FIELDS_MAX).map_err(|e| {
        if e.starts_with("more than") {
            (Status::FIELDS_TOO_LARGE, e)
        } else {
            bad(e)
        }
    })?;
    // RFC 9112 §3.2: a 1.1 request without exactly one Host is answered 400.
    if minor == 1 && headers.all("host").count() != 1 {
        return Err(bad("HTTP/1.1 request without exactly one Host".into()));
    }
    Ok(Request {
        method: method.to_string(),
        target,
        minor,
        headers,
    })
}

/// The path of a target, percent-decoded (RFC 3986 §2.1); `None` if an
/// escape is malformed or decodes to NUL.
pub fn decode_path(target: &str) -> Option<Vec<u8>> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    let mut out = Vec::with_capacity(path.len());
    let mut bytes = path.bytes();
    while let Some(b) = bytes.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let hex = [bytes.next()?, bytes.next()?];
        let v = u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?;
        if v == 0 {
            return None;
        }
        out.push(v);
    }
    Some(out)
}

/// What a target names under the root.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolved {
    File(PathBuf),
    /// A directory named without its trailing slash: where to redirect.
    Redirect(String),
    Refused(Status),
}

/// Finds the file a target names under `root` (canonical): a directory
/// means its `index.html`; whatever the path resolves to (`..`, symbolic
/// links) must stay under `root`.
pub fn resolve(root: &Path, target: &str) -> Resolved {
    use std::os::unix::ffi::OsStrExt;
    let Some(path) = decode_path(target) else {
        return Resolved::Refused(Status::BAD_REQUEST);
    };
    let rel = Path::new(std::ffi::OsStr::from_bytes(&path));
    let rel = rel.strip_prefix("/").unwrap_or(rel);
    let inside = |p: &Path| -> Result<PathBuf, Status> {
        let c = p.canonicalize().map_err(|_| Status::NOT_FOUND)?;
        if c.starts_with(root) {
            Ok(c)
        } else {
            Err(Status::FORBIDDEN)
        }
    };
    let found = match inside(&root.join(rel)) {
        Ok(f) => f,
        Err(s) => return Resolved::Refused(s),
    };
    let file = if found.is_dir() {
        if !path.ends_with(b"/") {
            let path = target.split(['?', '#']).next().unwrap_or("/");
            return Resolved::Redirect(format!("{path}/"));
        }
        match inside(&found.join("index.html")) {
            Ok(f) => f,
            Err(s) => return Resolved::Refused(s),
        }
    } else {
        found
    };
    if file.is_file() {
        Resolved::File(file)
    } else {
        Resolved::Refused(Status::NOT_FOUND)
    }
}

/// The media type of a file from its extension.
pub fn content_type(path: &Path) -> &'static str {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("txt" | "md") => "text/plain; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("json") => "application/json",
        Some("xml") => "application/xml",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("ico") => "image/x-icon",
        Some("webp") => "image/webp",
        Some("pdf") => "application/pdf",
        Some("wasm") => "application/wasm",
        Some("gz") => "application/gzip",
        _ => "application/octet-stream",
    }
}

/// An IMF-fixdate (RFC 9110 §5.6.7), for the `Date` field.
pub fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86400, secs % 86400);
    // Civil from days (Howard Hinnant's algorithm), in the proleptic
    // Gregorian calendar.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// A response head.
fn head(status: Status, length: u64, content_type: &str, keep: bool, extra: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {} {}\r\nServer: exonet\r\nDate: {}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {length}\r\nConnection: {}\r\n{extra}\r\n",
        status.0,
        status.1,
        http_date(SystemTime::now()),
        if keep { "keep-alive" } else { "close" },
    )
    .into_bytes()
}

/// A short text response; returns the body's length.
fn respond_text(
    s: &TcpStream,
    status: Status,
    keep: bool,
    extra: &str,
    with_body: bool,
) -> io::Result<u64> {
    let body = format!("{} {}\n", status.0, status.1);
    let mut out = head(
        status,
        body.len() as u64,
        "text/plain; charset=utf-8",
        keep,
        extra,
    );
    if with_body {
        out.extend_from_slice(body.as_bytes());
    }
    (&mut &*s).write_all(&out)?;
    Ok(if with_body { body.len() as u64 } else { 0 })
}

/// An error response after which the connection closes.
fn respond_error(s: &TcpStream, status: Status) -> io::Result<u64> {
    respond_text(s, status, false, "", true)
}

/// Sends the file (its head, and its body unless `head_only`) in chunks;
/// returns the body bytes sent.
fn respond_file(
    s: &TcpStream,
    mut file: File,
    path: &Path,
    keep: bool,
    head_only: bool,
) -> io::Result<u64> {
    let length = file.metadata()?.len();
    let mut w = s;
    w.write_all(&head(Status::OK, length, content_type(path), keep, ""))?;
    if head_only {
        return Ok(0);
    }
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    while sent < length {
        let want = CHUNK.min((length - sent) as usize);
        let n = file.read(&mut buf[..want])?;
        if n == 0 {
            // The file shrank: the promised length cannot be kept, so the
            // connection must end.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} shrank while being sent", path.display()),
            ));
        }
        w.write_all(&buf[..n])?;
        sent += n as u64;
    }
    Ok(sent)
}

fn log(peer: SocketAddr, line: &str, status: u16, bytes: u64, started: Instant) {
    eprintln!(
        "{peer} \"{line}\" {status} {bytes} {:.1}ms",
        tool::ms(started.elapsed())
    );
}

/// The request line as the access log shows it: printable, bounded.
fn shown(head: &[u8]) -> String {
    let line = tool::head_lines(head).next().unwrap_or_default();
    let text: String = String::from_utf8_lossy(line)
        .chars()
        .take(200)
        .map(|c| if c.is_control() || c == '"' { '?' } else { c })
        .collect();
    text
}

/// Serves one connection's requests until it closes, idles too long, or a
/// response must end it.
fn connection(s: &TcpStream, peer: SocketAddr, site: &Site) {
    if let Err(e) = requests(s, peer, site) {
        eprintln!("exonet http-serve: {peer}: {e}");
    }
    linger_close(s);
}

fn requests(s: &TcpStream, peer: SocketAddr, site: &Site) -> io::Result<()> {
    s.set_write_timeout(Some(site.idle))?;
    let mut r = BufReader::with_capacity(CHUNK, Patient::new(s, Some(site.idle))?);
    loop {
        let raw = match tool::read_head(&mut r, LINE_MAX, HEAD_MAX) {
            Ok(Some(h)) => h,
            Ok(None) => return Ok(()),
            Err(HeadError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => return Ok(()),
            Err(HeadError::Io(e)) => return Err(e),
            Err(HeadError::Truncated) => return Ok(()),
            Err(HeadError::LineTooLong) => {
                return reject(s, peer, site, "-", Status::URI_TOO_LONG);
            }
            Err(HeadError::TooLarge) => {
                return reject(s, peer, site, "-", Status::FIELDS_TOO_LARGE);
            }
        };
        let started = Instant::now();
        let line = shown(&raw);
        let req = match parse_request(&raw) {
            Ok(req) => req,
            Err((status, why)) => {
                eprintln!("exonet http-serve: {peer}: {why}");
                return reject(s, peer, site, &line, status);
            }
        };
        // Requests to a file server carry no body; one that does is read
        // and dropped, and a chunked one is not understood.
        if req.headers.get("transfer-encoding").is_some() {
            return reject(s, peer, site, &line, Status::NOT_IMPLEMENTED);
        }
        match req.headers.content_length() {
            Ok(Some(n)) => {
                io::copy(&mut (&mut r).take(n), &mut io::sink())?;
            }
            Ok(None) => {}
            Err(why) => {
                eprintln!("exonet http-serve: {peer}: {why}");
                return reject(s, peer, site, &line, Status::BAD_REQUEST);
            }
        }
        let keep = req.keep_alive();
        let head_only = req.method == "HEAD";
        site.requests.fetch_add(1, Ordering::Relaxed);
        let (status, sent) = if req.method != "GET" && !head_only {
            let n = respond_text(s, Status::METHOD, keep, "Allow: GET, HEAD\r\n", true)?;
            (Status::METHOD, n)
        } else {
            match resolve(&site.root, &req.target) {
                Resolved::File(path) => match File::open(&path) {
                    Ok(file) => match respond_file(s, file, &path, keep, head_only) {
                        Ok(n) => (Status::OK, n),
                        Err(e) => {
                            log(peer, &line, Status::OK.0, 0, started);
                            return Err(e);
                        }
                    },
                    // Not readable by this user.
                    Err(_) => {
                        let n = respond_text(s, Status::FORBIDDEN, keep, "", !head_only)?;
                        (Status::FORBIDDEN, n)
                    }
                },
                Resolved::Redirect(to) => {
                    let extra = format!("Location: {to}\r\n");
                    let n = respond_text(s, Status::MOVED, keep, &extra, !head_only)?;
                    (Status::MOVED, n)
                }
                Resolved::Refused(status) => {
                    (status, respond_text(s, status, keep, "", !head_only)?)
                }
            }
        };
        log(peer, &line, status.0, sent, started);
        if !keep {
            return Ok(());
        }
    }
}

/// Answers an error that ends the connection, and logs it.
fn reject(
    s: &TcpStream,
    peer: SocketAddr,
    site: &Site,
    line: &str,
    status: Status,
) -> io::Result<()> {
    site.requests.fetch_add(1, Ordering::Relaxed);
    let started = Instant::now();
    let n = respond_error(s, status)?;
    log(peer, line, status.0, n, started);
    Ok(())
}

/// Half-closes and reads what the peer still sends for a while, then
/// closes: closing with unread input would reset the connection and could
/// destroy the response before the peer read it (RFC 9112 §9.6).
fn linger_close(s: &TcpStream) {
    let _ = s.shutdown(Shutdown::Write);
    let until = Instant::now() + LINGER;
    let mut buf = [0u8; 4096];
    let mut r = s;
    let _ = s.set_read_timeout(Some(tool::TICK));
    while Instant::now() < until {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(s: &str) -> Result<Request, (Status, String)> {
        parse_request(s.as_bytes())
    }

    fn status(s: &str) -> u16 {
        req(s).unwrap_err().0 .0
    }

    #[test]
    fn requests_parse() {
        let r = req("GET /a/b.html?x=1 HTTP/1.1\r\nHost: h\r\nConnection: Keep-Alive, Close\r\nX-Empty:\r\n\r\n")
            .unwrap();
        assert_eq!(
            (r.method.as_str(), r.target.as_str(), r.minor),
            ("GET", "/a/b.html?x=1", 1)
        );
        assert_eq!(r.headers.get("HOST"), Some("h"));
        assert_eq!(r.headers.get("x-empty"), Some(""));
        assert!(!r.keep_alive(), "Connection: close is honoured");
        assert!(req("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            .unwrap()
            .keep_alive());
        // Bare LF line ends are accepted (RFC 9112 §2.2).
        assert!(!req("HEAD / HTTP/1.0\n\n").unwrap().keep_alive());
        assert!(req("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap()
            .keep_alive());
        let abs = req("GET http://h:8080/x/y HTTP/1.1\r\nHost: h\r\n\r\n").unwrap();
        assert_eq!(abs.target, "/x/y");
        assert_eq!(
            req("DELETE /x HTTP/1.1\r\nHost: h\r\n\r\n").unwrap().method,
            "DELETE"
        );
    }

    #[test]
    fn malformed_requests_are_refused() {
        for bad in [
            "\r\n",
            "GET\r\n\r\n",
            "GET /\r\n\r\n",
            "GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/1.1 x\r\nHost: h\r\n\r\n",
            "GET / http/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/1\r\nHost: h\r\n\r\n",
            "G(T / HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET x HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /\x7f HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            "GET / HTTP/1.1\r\nHost h\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : h\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: h\x01\r\n\r\n",
            "GET / HTTP/1.1\rHost: h\r\n\r\n",
            "GET /\0 HTTP/1.1\r\nHost: h\r\n\r\n",
        ] {
            assert_eq!(status(bad), 400, "{bad:?}");
        }
        assert_eq!(status("GET / HTTP/2.0\r\n\r\n"), 505);
        let many: String = (0..=FIELDS_MAX).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(
            status(&format!("GET / HTTP/1.1\r\nHost: h\r\n{many}\r\n")),
            431
        );
    }

    #[test]
    fn heads_are_read_within_bounds() {
        let read = |input: &[u8], line: usize, head: usize| {
            tool::read_head(&mut io::BufReader::with_capacity(7, input), line, head)
        };
        let got = read(b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\nnext", 100, 100);
        assert_eq!(got.unwrap().unwrap(), b"GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        assert!(read(b"", 100, 100).unwrap().is_none());
        assert!(matches!(
            read(b"GET / HT", 100, 100),
            Err(HeadError::Truncated)
        ));
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(200));
        assert!(matches!(
            read(long.as_bytes(), 100, 1000),
            Err(HeadError::LineTooLong)
        ));
        // Endless input without a line end stops at the bound.
        let endless = vec![b'a'; 1 << 20];
        assert!(matches!(
            read(&endless, 100, 1000),
            Err(HeadError::LineTooLong)
        ));
        let big = format!("GET / HTTP/1.1\r\n{}\r\n", "X: y\r\n".repeat(100));
        assert!(matches!(
            read(big.as_bytes(), 100, 300),
            Err(HeadError::TooLarge)
        ));
    }

    #[test]
    fn targets_resolve_inside_the_root_only() {
        let dir = std::env::temp_dir().join(format!("exonet-http-serve-{}", std::process::id()));
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::fs::write(root.join("index.html"), "hi").unwrap();
        std::fs::write(root.join("sub/index.html"), "sub").unwrap();
        std::fs::write(root.join("a b.txt"), "x").unwrap();
        std::fs::write(dir.join("secret"), "no").unwrap();
        let _ = std::os::unix::fs::symlink(dir.join("secret"), root.join("link"));
        let root = root.canonicalize().unwrap();
        let file = |p: &str| Resolved::File(root.join(p));
        assert_eq!(resolve(&root, "/"), file("index.html"));
        assert_eq!(resolve(&root, "/sub/"), file("sub/index.html"));
        assert_eq!(resolve(&root, "/sub?q"), Resolved::Redirect("/sub/".into()));
        assert_eq!(resolve(&root, "/a%20b.txt"), file("a b.txt"));
        assert_eq!(resolve(&root, "/sub/../index.html"), file("index.html"));
        let refused = |s: Status| Resolved::Refused(s);
        assert_eq!(resolve(&root, "/../secret"), refused(Status::FORBIDDEN));
        assert_eq!(resolve(&root, "/%2e%2e/secret"), refused(Status::FORBIDDEN));
        assert_eq!(resolve(&root, "/link"), refused(Status::FORBIDDEN));
        assert_eq!(resolve(&root, "/missing"), refused(Status::NOT_FOUND));
        assert_eq!(resolve(&root, "/empty/"), refused(Status::NOT_FOUND));
        assert_eq!(resolve(&root, "/a%2"), refused(Status::BAD_REQUEST));
        assert_eq!(resolve(&root, "/a%00"), refused(Status::BAD_REQUEST));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dates_and_types() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(http_date(leap), "Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(
            content_type(Path::new("a.HTML")),
            "text/html; charset=utf-8"
        );
        assert_eq!(content_type(Path::new("a.bin")), "application/octet-stream");
        assert_eq!(content_type(Path::new("noext")), "application/octet-stream");
    }
}
