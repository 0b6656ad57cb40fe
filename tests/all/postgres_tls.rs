//! TLS to Postgres: the test's throwaway server is given a CA and a server
//! certificate made here (with the openssl command), and the store
//! connects with libpq's `sslmode`/`sslrootcert` through rustls: verified
//! when asked, refused when the certificate is not the one trusted, and
//! the server itself reports the connections encrypted.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::context::ContextRules;
use airlock::sandbox::CancelToken;
use airlock::session::{PostgresStore, Session, SessionOptions, SessionStore, StoreError};
use serde_json::Value;

use crate::support::stores::{TestStore, admin, postgres_server};
use crate::support::tls::make_ca;
use crate::support::{airlock_with_env, host};

/// Puts the server's TLS settings back as they were when dropped.
struct ServerCertificate;

impl Drop for ServerCertificate {
    fn drop(&mut self) {
        let restore = async {
            admin("ALTER SYSTEM RESET ssl_cert_file").await;
            admin("ALTER SYSTEM RESET ssl_key_file").await;
            admin("SELECT pg_reload_conf()").await;
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            tokio::task::block_in_place(|| handle.block_on(restore));
        }
    }
}

/// `url` (the test store's) with the host, and `query` appended.
fn with(url: &str, host: &str, query: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (credentials, address) = rest.split_once('@').unwrap();
    let (_, port_and_db) = address.split_once(':').unwrap();
    format!("{scheme}://{credentials}@{host}:{port_and_db}?{query}")
}

/// How many of the server's connections to database `db` are encrypted,
/// and how many there are.
async fn encrypted_connections(db: &str) -> (i64, i64) {
    let url = format!("{}/postgres", postgres_server());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s
             JOIN pg_stat_activity a USING (pid) WHERE a.datname = $1",
            &[&db],
        )
        .await
        .unwrap();
    drop(client);
    let _ = driver.await;
    (row.get(0), row.get(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_speaks_tls_to_postgres_and_verifies_the_server() {
    let db = TestStore::new(crate::support::stores::Backend::Postgres, "tls").await;
    let dir = tempfile::tempdir().unwrap();
    make_ca(dir.path(), "trusted", true);
    make_ca(dir.path(), "other", false);
    // The server process (user postgres) must read the certificate and own
    // its key.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(
            dir.path().join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let chown = Command::new("chown")
            .args(["postgres:postgres", "server.key", "server.pem"])
            .current_dir(dir.path())
            .status()
            .unwrap();
        assert!(chown.success(), "chown the server's key to postgres");
    }
    let _restore = ServerCertificate;
    let path = |name: &str| dir.path().join(name).display().to_string();
    admin(&format!(
        "ALTER SYSTEM SET ssl_cert_file = '{}'",
        path("server.pem")
    ))
    .await;
    admin(&format!(
        "ALTER SYSTEM SET ssl_key_file = '{}'",
        path("server.key")
    ))
    .await;
    admin("ALTER SYSTEM SET ssl = on").await;
    admin("SELECT pg_reload_conf()").await;

    let trusted = path("trusted-ca.pem");
    let full = with(
        &db.spec,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={trusted}"),
    );
    // The reload is asynchronous: connect until the server presents the
    // new certificate (each attempt a real handshake), within a bound.
    let started = Instant::now();
    let store = loop {
        match PostgresStore::connect(&full).await {
            Ok(store) => break store,
            Err(e) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the server never presented the test certificate: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let store: Arc<dyn SessionStore> = Arc::new(store);
    let mut session = Session::open(
        Arc::clone(&store),
        SessionOptions {
            session_id: Some("over-tls".into()),
            ..SessionOptions::default()
        },
        &ContextRules::default(),
    )
    .await
    .unwrap();
    let call = airlock::ToolCall::new("increment", r#"{"name":"x"}"#);
    session
        .call(host().await, &call, &CancelToken::new(), None)
        .await
        .unwrap();
    session.close().await.unwrap();
    let database = db.spec.rsplit('/').next().unwrap().to_owned();
    let (encrypted, all) = encrypted_connections(&database).await;
    assert!(
        all > 0 && encrypted == all,
        "{encrypted} of {all} connections encrypted"
    );

    // A certificate from another CA, or for another name, is refused.
    let refused = |e: StoreError| e.to_string();
    let other = with(
        &db.spec,
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", path("other-ca.pem")),
    );
    let message = refused(PostgresStore::connect(&other).await.unwrap_err());
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    let by_ip = with(
        &db.spec,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={trusted}"),
    );
    let message = refused(PostgresStore::connect(&by_ip).await.unwrap_err());
    assert!(message.to_lowercase().contains("certificate"), "{message}");
    // verify-ca does not check the name; require checks nothing but
    // encrypts.
    let ca = with(
        &db.spec,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={trusted}"),
    );
    PostgresStore::connect(&ca).await.unwrap();
    PostgresStore::connect(&with(&db.spec, "127.0.0.1", "sslmode=require"))
        .await
        .unwrap();
    // A mode that can be downgraded is refused before connecting.
    let message = refused(
        PostgresStore::connect(&with(&db.spec, "localhost", "sslmode=prefer"))
            .await
            .unwrap_err(),
    );
    assert!(message.contains("sslmode=prefer"), "{message}");

    // The CLI takes the same URL, and never shows the password.
    let out = airlock_with_env(&["sessions", "list", "--store", &full, "--json"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["sessions"][0]["session_id"], "over-tls");
    let password = db.password().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(password));
}
