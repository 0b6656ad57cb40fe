//! Serving the secret grant: its value resolved for each call, for the
//! HTTP sender to add to requests to its origins (never to the guest).

use wasmtime::component::Linker;

use super::{CallSetup, Capability, GrantError, ResolvedSecret, SecretGrant};
use crate::policy::grants::MIN_REDACTED_BYTES;
use crate::sandbox::CallState;

impl Capability for SecretGrant {
    /// Secrets add no interface: the HTTP grant's sender injects them.
    fn link(_linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
        Ok(())
    }

    /// Read now, for this call. One that cannot be had (its variable
    /// unset) does not fail the call here: a request to its origins is
    /// refused, and only then does the call fail, naming it.
    fn prepare(&self, call: &mut CallSetup<'_>) -> Result<(), GrantError> {
        let value = self.resolve().map(|(value, raw)| {
            // Redacted from responses besides the header value: the secret
            // alone, unless it is too short to redact safely.
            let raw = (raw.len() >= MIN_REDACTED_BYTES && raw.as_bytes() != value.as_bytes())
                .then(|| raw.into_bytes());
            (value, raw)
        });
        call.secrets.push(ResolvedSecret {
            header: self.header.clone(),
            value,
            origins: std::sync::Arc::clone(&self.origins),
        });
        Ok(())
    }
}
