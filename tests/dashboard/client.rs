//! A raw HTTP/1.1 client over `TcpStream` (one request per connection), so the tests see
//! every status and header the server sends, and can send what no browser would.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// An answer: status, headers (names lower-case), body as text.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request with `headers` (a `Host` of `addr` unless given) and reads the answer.
pub fn send(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut head = format!("{method} {target} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body.as_bytes()).expect("write body");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read answer");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let answer = Answer {
        status,
        headers,
        body: body.to_string(),
    };
    assert_eq!(
        answer.header("transfer-encoding"),
        None,
        "the dashboard sends whole answers with their length"
    );
    answer
}

/// A GET with the token as a bearer header.
pub fn get(addr: SocketAddr, token: &str, target: &str) -> Answer {
    let auth = format!("Bearer {token}");
    send(addr, "GET", target, &[("Authorization", &auth)], "")
}

/// A form-encoded body from pairs.
pub fn form(pairs: &[(&str, &str)]) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        out.append_pair(k, v);
    }
    out.finish()
}

/// The value of the hidden `csrf` field of a page's forms.
pub fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a csrf field")
        + "name=\"csrf\" value=\"".len();
    page[at..].split('"').next().expect("a value").to_string()
}

/// A POST of an action with the token as a bearer header and `extra` headers.
pub fn post(
    addr: SocketAddr,
    token: &str,
    pairs: &[(&str, &str)],
    extra: &[(&str, &str)],
) -> Answer {
    let auth = format!("Bearer {token}");
    let mut headers = vec![("Authorization", auth.as_str())];
    headers.extend_from_slice(extra);
    send(addr, "POST", "/action", &headers, &form(pairs))
}
