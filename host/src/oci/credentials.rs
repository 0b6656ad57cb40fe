//! Who the host is to a registry: credentials from the environment or the
//! docker credential file, never printed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

/// Registry credentials: from `AIRLOCK_REGISTRY_USERNAME` and
/// `AIRLOCK_REGISTRY_PASSWORD` (or `AIRLOCK_REGISTRY_TOKEN`), else from the
/// docker credential file (`REGISTRY_AUTH_FILE`, else
/// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`: an `auths`
/// entry for the registry, `auth` or `username`/`password` or
/// `identitytoken`), else none. Never printed (its `Debug` says what kind
/// it is, not what it holds).
#[derive(Clone, Default)]
pub struct Credentials {
    all: Option<RegistryAuth>,
    by_registry: BTreeMap<String, RegistryAuth>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("from_environment", &self.all.is_some())
            .field("registries", &self.by_registry.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Credentials {
    /// None: every registry anonymously.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// As the environment and the docker credential file say (see the
    /// type's docs). A file that cannot be read is ignored (anonymous).
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let all = match (
            var("AIRLOCK_REGISTRY_USERNAME"),
            var("AIRLOCK_REGISTRY_PASSWORD"),
            var("AIRLOCK_REGISTRY_TOKEN"),
        ) {
            (Some(user), Some(password), _) => Some(RegistryAuth::Basic(user, password)),
            (_, _, Some(token)) => Some(RegistryAuth::Bearer(token)),
            _ => None,
        };
        let file = var("REGISTRY_AUTH_FILE")
            .map(PathBuf::from)
            .or_else(|| var("DOCKER_CONFIG").map(|dir| PathBuf::from(dir).join("config.json")))
            .or_else(|| dirs::home_dir().map(|home| home.join(".docker/config.json")));
        let by_registry = file
            .and_then(|path| std::fs::read(path).ok())
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .map(|doc| docker_auths(&doc))
            .unwrap_or_default();
        Self { all, by_registry }
    }

    pub(super) fn for_registry(&self, registry: &str) -> RegistryAuth {
        if let Some(all) = &self.all {
            return all.clone();
        }
        let bare = registry
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        self.by_registry
            .get(bare)
            .cloned()
            .unwrap_or(RegistryAuth::Anonymous)
    }
}

/// The `auths` of a docker config file, by registry.
fn docker_auths(doc: &Value) -> BTreeMap<String, RegistryAuth> {
    let Some(auths) = doc.get("auths").and_then(Value::as_object) else {
        return BTreeMap::new();
    };
    auths
        .iter()
        .filter_map(|(registry, entry)| {
            let field = |name: &str| {
                entry
                    .get(name)
                    .and_then(Value::as_str)
                    .filter(|v| !v.is_empty())
            };
            let auth = if let Some(token) =
                field("identitytoken").or_else(|| field("registrytoken"))
            {
                RegistryAuth::Bearer(token.to_owned())
            } else if let (Some(user), Some(password)) = (field("username"), field("password")) {
                RegistryAuth::Basic(user.to_owned(), password.to_owned())
            } else {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(field("auth")?)
                    .ok()?;
                let text = String::from_utf8(decoded).ok()?;
                let (user, password) = text.split_once(':')?;
                RegistryAuth::Basic(user.to_owned(), password.to_owned())
            };
            let key = registry
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_owned();
            Some((key, auth))
        })
        .collect()
}
