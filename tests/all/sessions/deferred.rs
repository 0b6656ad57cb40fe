//! Durability by what a call can lose: a call that changed nothing and
//! could reach nothing is committed without waiting for the disk
//! (`Flush::Deferred`), the rest wait. Proven by killing: `airlock mcp`
//! (the real binary, over stdio) is SIGKILLed right after the answer to
//! the k-th call of a sequence alternating a state change (`increment`)
//! and a read of a granted read-only directory (`read-text`), for every k;
//! the session then folds, holds every state change that was answered,
//! and no call is half there.

use airlock::journal::{CallStatus, Folded, Item};
use serde_json::json;

use crate::support::guest;
use crate::support::mcp::{call_with, connect};
use crate::support::stores::{Backend, TestStore};

async fn a_read_only_call_killed_after_its_answer_leaves_the_session_whole(backend: Backend) {
    for k in 1..=6usize {
        let store = TestStore::new(backend, &format!("deferred-{k}")).await;
        let dir = store.dir.path();
        std::fs::create_dir(dir.join("data")).unwrap();
        std::fs::write(dir.join("data/note.txt"), "kept").unwrap();
        let policy = dir.join("airlock.toml");
        std::fs::write(
            &policy,
            format!(
                "[[tool]]\npath = {:?}\n\n[[tool]]\npath = {:?}\n\
                 dirs = [{{ host = \"data\", guest = \"/data\", mode = \"ro\" }}]\n",
                guest("stateful"),
                guest("reach"),
            ),
        )
        .unwrap();
        let args = [
            "--config",
            path(&policy),
            "--store",
            &store.spec,
            "--session",
            "s",
        ];
        let (client, pid) = connect(&args).await;
        let mut increments = 0;
        for i in 0..k {
            let result = if i % 2 == 0 {
                increments += 1;
                call_with(
                    &client,
                    Default::default(),
                    "increment",
                    json!({"name": "a"}),
                )
                .await
            } else {
                call_with(
                    &client,
                    Default::default(),
                    "read-text",
                    json!({"path": "/data/note.txt"}),
                )
                .await
            };
            assert_eq!(result.is_error, Some(false), "call {i}");
        }
        // Right after the k-th answer: for an even k, a read-only call's.
        // SAFETY: kill(2) on the server's own pid.
        #[allow(unsafe_code)]
        let killed = unsafe { libc::kill(pid.cast_signed(), libc::SIGKILL) };
        assert_eq!(killed, 0);
        drop(client);

        let stored = store.open().await.read(None, "s").await.unwrap();
        let folded = Folded::fold(&stored.records).expect("the journal folds after a kill");
        assert_eq!(
            folded.deps["counters"]["a"], increments,
            "k = {k}: every answered state change is there"
        );
        // Never half: each call's intent has its output, completed.
        let items = &folded.transcript.items;
        let intents = items
            .iter()
            .filter(|e| matches!(e.item, Item::FunctionCall { .. }))
            .count();
        let outputs: Vec<CallStatus> = items
            .iter()
            .filter_map(|e| match &e.item {
                Item::FunctionCallOutput { status, .. } => Some(*status),
                _ => None,
            })
            .collect();
        assert_eq!(intents, outputs.len(), "k = {k}: a call half there");
        assert!(
            outputs.iter().all(|s| *s == CallStatus::Completed),
            "k = {k}: {outputs:?}"
        );
        // The read-only calls answered are there or not (a crash of the
        // process loses none; a power cut could lose those after the last
        // state change), never more than were made.
        assert!(
            intents <= k && intents >= increments,
            "k = {k}: {intents} calls"
        );
        // And it resumes: a new server serves the session from there.
        let (client, _) = connect(&args).await;
        let again = call_with(
            &client,
            Default::default(),
            "increment",
            json!({"name": "a"}),
        )
        .await;
        assert_eq!(
            again.structured_content.unwrap()["value"],
            increments + 1,
            "k = {k}"
        );
        client.cancel().await.unwrap();
    }
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

crate::on_both_stores!(a_read_only_call_killed_after_its_answer_leaves_the_session_whole);
