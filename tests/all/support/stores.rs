//! The two session stores the suites run against: a SQLite file in a
//! temporary directory, and a fresh database on the Postgres server that
//! `make test` starts (`AIRLOCK_TEST_POSTGRES`, a URL without a database:
//! `postgres://user:password@127.0.0.1:PORT`).

use std::path::PathBuf;
use std::sync::Arc;

use airlock::session::{PostgresStore, SessionStore, SqliteStore};

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The Postgres server's URL (no database), from `AIRLOCK_TEST_POSTGRES`.
pub fn postgres_server() -> String {
    match std::env::var("AIRLOCK_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => url.trim_end_matches('/').to_owned(),
        _ => panic!(
            "the Postgres tests need a server: run `make test` (it starts a throwaway one), \
             or set AIRLOCK_TEST_POSTGRES=postgres://USER:PASSWORD@127.0.0.1:PORT"
        ),
    }
}

/// Runs one SQL statement on the server's `postgres` database.
pub async fn admin(sql: &str) {
    let url = format!("{}/postgres", postgres_server());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot reach the test Postgres server: {e}"));
    let driver = tokio::spawn(connection);
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    drop(client);
    let _ = driver.await;
}

/// One empty store of a test's own.
#[derive(Debug)]
pub struct TestStore {
    pub backend: Backend,
    /// What `--store` takes: the file, or the database's URL.
    pub spec: String,
    /// Holds the SQLite file (and anything else the test writes).
    pub dir: tempfile::TempDir,
    /// The SQLite file (none is made until the store is opened).
    pub file: PathBuf,
}

impl TestStore {
    /// A new, empty store named after `name`.
    pub async fn new(backend: Backend, name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(format!("{name}.db"));
        let spec = match backend {
            Backend::Sqlite => file.display().to_string(),
            Backend::Postgres => {
                let unique = uuid::Uuid::new_v4().simple().to_string();
                let db = format!("airlock_{}_{}", name.replace('-', "_"), &unique[..8]);
                admin(&format!("CREATE DATABASE {db}")).await;
                format!("{}/{db}", postgres_server())
            }
        };
        Self {
            backend,
            spec,
            dir,
            file,
        }
    }

    /// A new connection to the store, as another process would have.
    pub async fn open(&self) -> Arc<dyn SessionStore> {
        match self.backend {
            Backend::Sqlite => Arc::new(SqliteStore::open(&self.file).unwrap()),
            Backend::Postgres => Arc::new(PostgresStore::connect(&self.spec).await.unwrap()),
        }
    }

    /// Runs SQL on the store behind Airlock's back (tables as each store
    /// names them: `{p}` stands for `airlock_` on Postgres, nothing on
    /// SQLite).
    pub async fn execute(&self, sql: &str) {
        match self.backend {
            Backend::Sqlite => {
                let sql = sql.replace("{p}", "");
                let conn = rusqlite::Connection::open(&self.file).unwrap();
                conn.execute_batch(&sql)
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            Backend::Postgres => {
                let sql = sql.replace("{p}", "airlock_");
                let (client, driver) = self.client().await;
                client
                    .batch_execute(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                drop(client);
                let _ = driver.await;
            }
        }
    }

    /// The one integer `sql` selects, read behind Airlock's back (tables
    /// named as for [`TestStore::execute`]).
    pub async fn scalar(&self, sql: &str) -> i64 {
        match self.backend {
            Backend::Sqlite => {
                let sql = sql.replace("{p}", "");
                let conn = rusqlite::Connection::open(&self.file).unwrap();
                conn.query_row(&sql, [], |row| row.get(0))
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
            Backend::Postgres => {
                let sql = sql.replace("{p}", "airlock_");
                let (client, driver) = self.client().await;
                let value: i64 = client
                    .query_one(&sql, &[])
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"))
                    .get(0);
                drop(client);
                let _ = driver.await;
                value
            }
        }
    }

    /// A connection to the Postgres store behind Airlock's back, and the
    /// task that drives it (it ends once the client is dropped).
    async fn client(&self) -> (tokio_postgres::Client, tokio::task::JoinHandle<()>) {
        let (client, connection) = tokio_postgres::connect(&self.spec, tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        (client, driver)
    }

    /// What the store reports as its location.
    pub fn location(&self) -> String {
        match self.backend {
            Backend::Sqlite => format!("sqlite:{}", self.spec),
            Backend::Postgres => {
                // The URL without its password.
                let (scheme, rest) = self.spec.split_once("://").unwrap();
                let (credentials, address) = rest.split_once('@').unwrap();
                let user = credentials.split(':').next().unwrap();
                format!("{scheme}://{user}@{address}")
            }
        }
    }

    /// The password in the store's URL, which no output may show.
    pub fn password(&self) -> Option<&str> {
        let rest = self.spec.split_once("://")?.1;
        let credentials = rest.split_once('@')?.0;
        credentials.split_once(':').map(|(_, password)| password)
    }

    /// Every byte the store keeps: the SQLite file and its WAL, or a dump
    /// of the whole database.
    pub fn raw_bytes(&self) -> Vec<u8> {
        match self.backend {
            Backend::Sqlite => {
                let name = self
                    .file
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let mut bytes = Vec::new();
                for file in std::fs::read_dir(self.dir.path()).unwrap() {
                    let file = file.unwrap().path();
                    if file
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(&name)
                    {
                        // SQLite may remove its -wal or -shm file meanwhile.
                        match std::fs::read(&file) {
                            Ok(read) => bytes.extend(read),
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => panic!("{}: {e}", file.display()),
                        }
                    }
                }
                assert!(
                    !bytes.is_empty(),
                    "no store file in {}",
                    self.dir.path().display()
                );
                bytes
            }
            Backend::Postgres => {
                let out = std::process::Command::new("pg_dump")
                    .args(["--no-owner", "--dbname", &self.spec])
                    .output()
                    .expect("pg_dump runs (postgresql-client is installed with the server)");
                assert!(
                    out.status.success(),
                    "pg_dump: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                assert!(String::from_utf8_lossy(&out.stdout).contains("airlock_records"));
                out.stdout
            }
        }
    }
}

/// Generates, for each named `async fn NAME(backend: Backend)` of the
/// enclosing module, a test on each store: `sqlite::NAME` and
/// `postgres::NAME`.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::stores::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::stores::Backend::Postgres).await
                }
            )*
        }
    };
}
