//! A real HTTP/1.1 server on 127.0.0.1 for the HTTP grant tests. It records
//! every request it receives (path and headers), so a test can check what
//! reached the server, and serves:
//!
//! - `/hello`: `hello from loopback`
//! - `/echo`: the request's headers, one `name: value` per line
//! - `/body`: the request's body, read whole before it answers
//! - `/big`: 2 MiB of `b`
//! - `/slow`: answers after 30 s

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};

#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
}

pub struct Loopback {
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    _served: super::Served,
}

impl Loopback {
    pub async fn start() -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&requests);
        let served = super::serve(move |req| serve(req, Arc::clone(&recorded))).await;
        Self {
            addr: served.addr,
            requests,
            _served: served,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().expect("not poisoned").clone()
    }
}

async fn serve(
    req: Request<hyper::body::Incoming>,
    recorded: Arc<Mutex<Vec<Recorded>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let path = req.uri().path().to_owned();
    recorded.lock().expect("not poisoned").push(Recorded {
        path: path.clone(),
        headers: headers.clone(),
    });
    let body = match path.as_str() {
        "/hello" => Bytes::from_static(b"hello from loopback"),
        "/echo" => headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}\n"))
            .collect::<String>()
            .into(),
        "/body" => {
            use http_body_util::BodyExt;
            match req.into_body().collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(_) => Bytes::from_static(b"the body did not arrive"),
            }
        }
        "/big" => Bytes::from(vec![b'b'; 2 << 20]),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Bytes::from_static(b"too late")
        }
        _ => {
            return Ok(Response::builder()
                .status(404)
                .body(Full::new(Bytes::from_static(b"not found")))
                .unwrap_or_default());
        }
    };
    Ok(Response::new(Full::new(body)))
}
