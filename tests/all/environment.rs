//! The environment grant: no variables unless granted, exactly the granted
//! ones with one.

use airlock::context::ContextRules;
use airlock::sandbox::grants::EnvGrant;
use airlock::{RunContext, ToolConfig};
use serde_json::json;

use crate::support::{call, host_with};

#[tokio::test]
async fn environment_is_empty_unless_granted() {
    // The test process has PATH and HOME; the guest sees neither unless
    // granted, and then only the granted one.
    let home = std::env::var("HOME").expect("HOME is set for tests");
    let host = host_with(
        &[("hostile", ToolConfig::default())],
        ContextRules::default(),
    )
    .await;
    let mut ctx = RunContext::default();
    let all = call(&host, &mut ctx, "dump_env", json!({})).await.unwrap();
    assert_eq!(all.result, json!({}));
    let path = call(&host, &mut ctx, "read_env", json!({"name": "PATH"}))
        .await
        .unwrap();
    assert_eq!(path.result["value"], serde_json::Value::Null);

    let mut config = ToolConfig::default();
    config.grants.env = vec![EnvGrant::new("HOME").unwrap()];
    let host = host_with(&[("hostile", config)], ContextRules::default()).await;
    let all = call(&host, &mut ctx, "dump_env", json!({})).await.unwrap();
    assert_eq!(all.result, json!({ "HOME": home }));
}
