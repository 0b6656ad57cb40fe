//! Who the host is to a registry: credentials from the environment or the
//! docker credential file, each bound to the one registry it was given
//! for, never printed.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine as _;
use serde_json::Value;

use super::OciError;

/// What the host shows one registry.
#[derive(Clone, Default)]
pub(crate) enum Auth {
    /// Nothing.
    #[default]
    Anonymous,
    /// A user and password: sent as HTTP basic auth to the registry, and
    /// to a token service on the registry's own host.
    Basic(String, String),
    /// A token, sent as is (`Authorization: Bearer …`).
    Bearer(String),
}

/// Registry credentials, each for one registry (`host[:port]`):
/// `AIRLOCK_REGISTRY_USERNAME` and `AIRLOCK_REGISTRY_PASSWORD` (or
/// `AIRLOCK_REGISTRY_TOKEN`) for the registry `AIRLOCK_REGISTRY` names,
/// and the docker credential file's `auths` entries (`REGISTRY_AUTH_FILE`,
/// else `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`: `auth`
/// or `username`/`password` or `identitytoken`) for theirs. A registry
/// none names is reached anonymously: no credential ever goes to a
/// registry it was not given for, nor to a host a registry points to
/// (a redirect, an upload location, a token service on another host).
/// Never printed (its `Debug` names the registries, not what they hold).
#[derive(Clone, Default)]
pub struct Credentials {
    by_registry: BTreeMap<String, Auth>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("registries", &self.by_registry.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The registry as credentials are filed: `host[:port]`, no scheme, no
/// trailing slash, the host in lowercase.
fn registry_key(registry: &str) -> String {
    registry
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_ascii_lowercase()
}

impl Credentials {
    /// None: every registry anonymously.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// As the environment and the docker credential file say (see the
    /// type's docs). A file that cannot be read is ignored (anonymous).
    /// Credentials in the environment without `AIRLOCK_REGISTRY` naming
    /// their registry are an error: sent to every registry they would
    /// reach whichever one a policy or a command names.
    pub fn from_env() -> Result<Self, OciError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let from_env = match (
            var("AIRLOCK_REGISTRY_USERNAME"),
            var("AIRLOCK_REGISTRY_PASSWORD"),
            var("AIRLOCK_REGISTRY_TOKEN"),
        ) {
            (Some(user), Some(password), _) => Some(Auth::Basic(user, password)),
            (_, _, Some(token)) => Some(Auth::Bearer(token)),
            _ => None,
        };
        let file = var("REGISTRY_AUTH_FILE")
            .map(PathBuf::from)
            .or_else(|| var("DOCKER_CONFIG").map(|dir| PathBuf::from(dir).join("config.json")))
            .or_else(|| dirs::home_dir().map(|home| home.join(".docker/config.json")));
        let mut by_registry = file
            .and_then(|path| crate::fs::read_settings(&path).ok())
            .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
            .map(|doc| docker_auths(&doc))
            .unwrap_or_default();
        if let Some(auth) = from_env {
            let Some(registry) = var("AIRLOCK_REGISTRY") else {
                return Err(OciError::Credentials(
                    "AIRLOCK_REGISTRY_USERNAME/AIRLOCK_REGISTRY_PASSWORD (or \
                     AIRLOCK_REGISTRY_TOKEN) are set, but AIRLOCK_REGISTRY does not name the \
                     registry they are for: set AIRLOCK_REGISTRY=HOST[:PORT]"
                        .into(),
                ));
            };
            by_registry.insert(registry_key(&registry), auth);
        }
        Ok(Self { by_registry })
    }

    /// What to show `registry` (`host[:port]`): its own credentials, or
    /// none.
    pub(super) fn for_registry(&self, registry: &str) -> Auth {
        self.by_registry
            .get(&registry_key(registry))
            .cloned()
            .unwrap_or_default()
    }
}

/// The `auths` of a docker config file, by registry.
fn docker_auths(doc: &Value) -> BTreeMap<String, Auth> {
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
                Auth::Bearer(token.to_owned())
            } else if let (Some(user), Some(password)) = (field("username"), field("password")) {
                Auth::Basic(user.to_owned(), password.to_owned())
            } else {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(field("auth")?)
                    .ok()?;
                let text = String::from_utf8(decoded).ok()?;
                let (user, password) = text.split_once(':')?;
                Auth::Basic(user.to_owned(), password.to_owned())
            };
            Some((registry_key(registry), auth))
        })
        .collect()
}
