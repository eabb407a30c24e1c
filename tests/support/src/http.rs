//! The HTTP/1.1 wire both loopback services speak — the tests' [`downstream`]
//! and the torture harness's service — and the blocking client their tools
//! use: one request per connection, `Connection: close`, `Content-Length`
//! bodies, the `Idempotency-Key` header, every socket with a timeout.
//!
//! [`downstream`]: crate::downstream

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Bodies larger than this are cut (a service never needs more).
const MAX_BODY: usize = 1 << 20;

/// One request as a service saw it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `POST`.
    pub method: String,
    /// The path without the query.
    pub path: String,
    /// The decoded query parameters.
    pub query: Vec<(String, String)>,
    /// The `Idempotency-Key` header.
    pub key: Option<String>,
    /// The body.
    pub body: String,
}

impl Request {
    /// The value of query parameter `name`.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Body text.
    pub body: String,
}

/// Reads one request; `Ok(None)` when the peer went away before sending a
/// whole one (a killed client): such a request is never acted on.
///
/// # Errors
/// Socket errors and timeouts.
pub fn read_request(stream: &TcpStream) -> io::Result<Option<Request>> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.trim_end().splitn(3, ' ');
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Ok(None);
    };
    let (method, target) = (method.to_owned(), target.to_owned());
    let mut key = None;
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 {
            return Ok(None);
        }
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse().unwrap_or(0).min(MAX_BODY),
                "idempotency-key" => key = Some(value.to_owned()),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return Ok(None);
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    Ok(Some(Request {
        method,
        path: path.to_owned(),
        query,
        key,
        body: String::from_utf8_lossy(&body).into_owned(),
    }))
}

/// Writes one JSON response and flushes.
///
/// # Errors
/// Socket errors and timeouts.
pub fn write_response(stream: &mut TcpStream, status: u16, body: &str) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}

/// Percent-encodes a query component (unreserved characters pass).
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes a query component: `%XX` escapes and `+` for a space; a `%`
/// not followed by two hex digits stays as it is.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One blocking request with `timeout` on connect, each write and each read.
/// A connection closed without an answer is an `UnexpectedEof`.
///
/// # Errors
/// Socket errors, timeouts, a malformed answer.
pub fn request_blocking(
    addr: SocketAddr,
    method: &str,
    target: &str,
    key: Option<&str>,
    body: &str,
    timeout: Duration,
) -> io::Result<Response> {
    request_then(addr, method, target, key, body, timeout, || {})
}

/// [`request_blocking`], calling `sent` after the whole request was sent and
/// before the answer is read (the torture harness's in-flight crash point).
///
/// # Errors
/// As [`request_blocking`].
pub fn request_then(
    addr: SocketAddr,
    method: &str,
    target: &str,
    key: Option<&str>,
    body: &str,
    timeout: Duration,
    sent: impl FnOnce(),
) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(key) = key {
        head.push_str(&format!("Idempotency-Key: {key}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    stream.write_all(head.as_bytes())?;
    stream.flush()?;
    sent();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed without a response",
        ));
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad status line"))?;
    Ok(Response {
        status,
        body: body.to_owned(),
    })
}
